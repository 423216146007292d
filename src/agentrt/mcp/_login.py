"""`agentrt login`: a person authorizes agentrt to reach one remote server.

The flow is the official SDK's `OAuthClientProvider` (discovery from the
server's `401` and its protected resource metadata, RFC 9728; the
authorization server's metadata with the spec's fallbacks, RFC 8414 and
OpenID; the resource check; registration as pre-registered client, client ID
metadata document or dynamic registration; PKCE S256; `state` and `iss`
checked; the resource indicator, RFC 8707), driven here with:

- a loopback listener on `127.0.0.1` and an ephemeral port (RFC 8252) that
  takes exactly one authorization response, from the browser the person
  opens on the printed URL;
- a refusal, before the SDK runs, of protected resource metadata that the
  server's `401` points at on another origin (the SDK would fetch it);
- the scope the person is asked for widened by any scope a server asked
  for in a `403 insufficient_scope` since the last login (step-up: only a
  person widens it);
- the tokens written to the server's owner-only token file with what a
  later refresh needs (`_tokens.py`), under its lock.

`client_credentials` needs no person: the secret (or a client assertion signed
by a private key, `private_key_jwt`) is read from an owner-only file and taken
to the authorization server's token endpoint; so does `identity_assertion`,
whose ID-JAG comes from the identity provider's token exchange of the
person's ID token (`_assertions.py`, decision 0045).
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.parse
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import httpx2

from ..errors import AgentrtError
from ..sanitize import sanitize
from ._oauth import (
    TokenResponseError,
    _challenge,
    _error_code,
    _origin,
    _union,
    canonical_resource,
    post_token_request,
    updated_record,
)
from ._tokens import AuthSettings, TokenRecord, TokenStoreError, token_file

if TYPE_CHECKING:
    from mcp.shared.auth import OAuthMetadata

__all__ = ["AuthSettings", "LoginError", "login", "read_secret_file"]

_PROTOCOL_VERSION: Final = "2025-11-25"
_INITIALIZE: Final = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    b'"capabilities":{},"clientInfo":{"name":"agentrt-login","version":"1"}}}'
)
_INITIALIZED: Final = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
_LIST_TOOLS: Final = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}'
_HEADERS: Final = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": _PROTOCOL_VERSION,
}
_PAGE: Final = (
    b"<!doctype html><meta charset=utf-8><title>agentrt</title>"
    b"<p>agentrt received the authorization; you can close this window.</p>"
)


class LoginError(AgentrtError):
    """A login could not be completed; nothing was stored."""


def read_secret_file(path: Path) -> str:
    """A client secret from an owner-only file (refused when others can read it)."""
    from ._assertions import CredentialError, read_owner_only

    try:
        return read_owner_only(path, "client secret file")
    except CredentialError as exc:
        raise LoginError(str(exc)) from None


class _Callback:
    """A loopback listener that takes one authorization response."""

    def __init__(self) -> None:
        self.result: dict[str, str] | None = None
        self.arrived = anyio.Event()

    async def serve(self, listener: Any) -> None:
        await listener.serve(self._handle)

    async def _handle(self, stream: Any) -> None:
        async with stream:
            request = b""
            with anyio.move_on_after(10):
                while b"\r\n\r\n" not in request and len(request) < 16384:
                    try:
                        request += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break
            line = request.split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split(" ")
            target = parts[1] if len(parts) >= 2 else ""
            parsed = urllib.parse.urlsplit(target)
            if parts[0:1] != ["GET"] or parsed.path != "/callback" or self.result is not None:
                await stream.send(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                return
            query = urllib.parse.parse_qs(parsed.query)
            self.result = {key: values[0] for key, values in query.items()}
            await stream.send(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\n"
                + f"content-length: {len(_PAGE)}\r\nconnection: close\r\n\r\n".encode()
                + _PAGE
            )
            self.arrived.set()


async def login(
    name: str,
    endpoint: str,
    settings: AuthSettings,
    *,
    show_url: Callable[[str], Awaitable[None] | None],
    timeout: float = 300.0,  # noqa: ASYNC109 - how long the person has to answer
    directory: Path | None = None,
) -> TokenRecord:
    """Authorize agentrt for server `name` at `endpoint` and store its tokens.

    `show_url` is handed the authorization URL (to print it and open a
    browser).  Raises `LoginError` with one sentence when the flow fails."""
    resource = canonical_resource(endpoint)
    file = token_file(name, resource, directory)
    try:
        previous = file.read()
    except TokenStoreError as exc:
        raise LoginError(str(exc)) from None
    wanted = _union(
        previous.scope if previous else None, previous.wanted_scope if previous else None
    )
    if settings.grant in ("client_credentials", "identity_assertion"):
        record = await _machine_grant(name, endpoint, settings)
    else:
        record = await _authorization_code(
            name, endpoint, settings, wanted or None, previous, show_url=show_url, timeout=timeout
        )
    async with file.locked():
        file.write(record)
    return record


async def _discover(name: str, endpoint: str) -> str | None:
    """The resource metadata URL the server's unauthenticated answer names, if it is a 401
    that names one (metadata on another origin is refused)."""
    async with httpx2.AsyncClient(follow_redirects=False, timeout=30.0) as client:
        try:
            response = await client.post(endpoint, content=_INITIALIZE, headers=_HEADERS)
        except httpx2.HTTPError as exc:
            raise LoginError(
                f'server "{sanitize(name)}" could not be reached: {sanitize(str(exc))}'
            ) from None
    if response.status_code != 401:
        return None
    return _refuse_metadata_elsewhere(name, endpoint, response)


def _refuse_metadata_elsewhere(name: str, endpoint: str, response: httpx2.Response) -> str | None:
    """The `resource_metadata` a 401 names; refused when it is on another origin than the
    server's (the SDK would fetch it and trust what it says: a mix-up, or a forgery)."""
    challenge = _challenge(response.headers.get("www-authenticate", ""))
    metadata = challenge.get("resource_metadata")
    if metadata is not None and _origin(metadata) != _origin(endpoint):
        raise LoginError(
            f'server "{sanitize(name)}" names its resource metadata on another origin '
            f"({sanitize(metadata)}), which is refused"
        )
    return metadata


async def _authorization_code(
    name: str,
    endpoint: str,
    settings: AuthSettings,
    wanted: str | None,
    previous: TokenRecord | None,
    *,
    show_url: Callable[[str], Awaitable[None] | None],
    timeout: float,  # noqa: ASYNC109 - how long the person has to answer
) -> TokenRecord:
    from mcp.client.auth import OAuthClientProvider, OAuthFlowError
    from mcp.client.auth.exceptions import OAuthRegistrationError, OAuthTokenError
    from mcp.shared.auth import (
        AuthorizationCodeResult,
        OAuthClientInformationFull,
        OAuthClientMetadata,
        OAuthToken,
    )

    callback = _Callback()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610 - not SQL
    redirect_uri = f"http://127.0.0.1:{port}/callback"
    metadata = OAuthClientMetadata(
        redirect_uris=[redirect_uri],  # type: ignore[list-item]
        client_name="agentrt",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",  # noqa: S106 - a public client: no secret
        scope=settings.scope,
    )
    preregistered: OAuthClientInformationFull | None = None
    if settings.client_id is not None:
        secret = (
            read_secret_file(settings.client_secret_file)
            if settings.client_secret_file is not None
            else None
        )
        preregistered = OAuthClientInformationFull(
            client_id=settings.client_id,
            client_secret=secret,
            redirect_uris=[redirect_uri],  # type: ignore[list-item]
            token_endpoint_auth_method="client_secret_basic" if secret else "none",
            grant_types=["authorization_code", "refresh_token"],
        )

    if preregistered is None and previous is not None and previous.grant == "authorization_code":
        # The client registered at the last login, bound to its issuer: a new login keeps
        # the same client, so a server that binds its sessions to the client keeps them.
        preregistered = OAuthClientInformationFull(
            client_id=previous.client_id,
            client_secret=previous.client_secret,
            redirect_uris=[redirect_uri],  # type: ignore[list-item]
            token_endpoint_auth_method=previous.token_endpoint_auth_method,  # type: ignore[arg-type]
            grant_types=["authorization_code", "refresh_token"],
            issuer=previous.issuer,
        )

    class _Memory:
        """The SDK's storage: this login starts from no tokens (it is a new grant)."""

        def __init__(self) -> None:
            self.tokens: OAuthToken | None = None
            self.client: OAuthClientInformationFull | None = preregistered

        async def get_tokens(self) -> OAuthToken | None:
            return None

        async def set_tokens(self, tokens: OAuthToken) -> None:
            self.tokens = tokens

        async def get_client_info(self) -> OAuthClientInformationFull | None:
            return self.client

        async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
            self.client = client_info

    class _Provider(OAuthClientProvider):
        async def async_auth_flow(
            self, request: httpx2.Request
        ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
            # Step-up reaches the registration too: an authorization server may refuse a
            # scope the client was not registered with.
            flow = super().async_auth_flow(request)
            try:
                outgoing = await flow.__anext__()
                while True:
                    response = yield _registering_for(outgoing, wanted)
                    if response.status_code == 401 and outgoing is request:
                        _refuse_metadata_elsewhere(name, endpoint, response)
                    outgoing = await flow.asend(response)
            except StopAsyncIteration:
                return
            finally:
                await flow.aclose()

        async def _perform_authorization_code_grant(self) -> tuple[str, str]:
            # Step-up: the scope the person is asked for includes what a server asked for.
            if wanted:
                self.context.client_metadata.scope = _union(
                    self.context.client_metadata.scope, wanted
                )
            return await super()._perform_authorization_code_grant()

    async def redirect(url: str) -> None:
        shown = show_url(url)
        if shown is not None:
            await shown

    async def arrived() -> AuthorizationCodeResult:
        with anyio.move_on_after(timeout):
            await callback.arrived.wait()
        if callback.result is None:
            raise LoginError(f"no authorization arrived within {timeout:g}s")
        result = callback.result
        if "error" in result:
            raise LoginError(
                f"the authorization server refused the login: {sanitize(result['error'])}"
                + (
                    f" ({sanitize(result['error_description'])})"
                    if "error_description" in result
                    else ""
                )
            )
        return AuthorizationCodeResult(
            code=result.get("code", ""), state=result.get("state"), iss=result.get("iss")
        )

    storage = _Memory()
    provider = _Provider(
        server_url=endpoint,
        client_metadata=metadata,
        storage=storage,
        redirect_handler=redirect,
        callback_handler=arrived,
        client_metadata_url=settings.client_metadata_url,
    )
    failure: str | None = None
    status = 0
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(callback.serve, listener)
            try:
                status = await _initialize_through(provider, endpoint)
            except LoginError as exc:
                failure = str(exc)
            except (OAuthFlowError, OAuthTokenError, OAuthRegistrationError, ValueError) as exc:
                failure = (
                    f'the login to server "{sanitize(name)}" failed: {_without_secrets(str(exc))}'
                )
            except httpx2.HTTPError as exc:
                failure = f'the login to server "{sanitize(name)}" failed: {sanitize(str(exc))}'
            finally:
                group.cancel_scope.cancel()
    finally:
        await listener.aclose()
    if failure is not None:
        raise LoginError(failure)
    response_status = status
    tokens = storage.tokens
    client_info = storage.client
    context = provider.context
    if tokens is None or client_info is None:
        raise LoginError(f'the login to server "{sanitize(name)}" ended without a token')
    if response_status in (401, 403):
        raise LoginError(
            f'server "{sanitize(name)}" refused the new token (HTTP {response_status})'
        )
    now = time.time()
    return TokenRecord(
        server=name,
        resource=canonical_resource(endpoint),
        issuer=str(context.oauth_metadata.issuer) if context.oauth_metadata else None,
        token_endpoint=provider._get_token_endpoint(),
        client_id=client_info.client_id or "",
        client_secret=client_info.client_secret,
        token_endpoint_auth_method=client_info.token_endpoint_auth_method,
        access_token=tokens.access_token,
        refresh_token=tokens.refresh_token,
        expires_at=now + tokens.expires_in if tokens.expires_in else None,
        issued_at=now,
        scope=tokens.scope,
    )


async def _initialize_through(auth: httpx2.Auth, endpoint: str) -> int:
    """Open a session through `auth` as a client would (initialize, initialized, tools/list)
    so that whichever request the server refuses with 401 runs the flow; end the session;
    return the last status."""
    async with httpx2.AsyncClient(auth=auth, follow_redirects=False, timeout=30.0) as client:
        response = await client.post(endpoint, content=_INITIALIZE, headers=_HEADERS)
        session = response.headers.get("mcp-session-id")
        headers = dict(_HEADERS)
        if session:
            headers["mcp-session-id"] = session
        if response.status_code == 200:
            await response.aread()
            for message in (_INITIALIZED, _LIST_TOOLS):
                response = await client.post(endpoint, content=message, headers=headers)
                await response.aread()
                if response.status_code >= 400:
                    break
        if session:
            with contextlib.suppress(httpx2.HTTPError):
                await client.delete(endpoint, headers=headers)
        return response.status_code


def _registering_for(request: httpx2.Request, wanted: str | None) -> httpx2.Request:
    """A dynamic registration request asking for `wanted` too; any other request as it is."""
    if not wanted or request.method != "POST":
        return request
    if not request.headers.get("content-type", "").startswith("application/json"):
        return request
    try:
        body = json.loads(request.content)
    except ValueError:
        return request
    if not isinstance(body, dict) or "redirect_uris" not in body:
        return request
    body["scope"] = _union(body.get("scope"), wanted)
    headers = {
        key: value for key, value in request.headers.items() if key.lower() != "content-length"
    }
    return httpx2.Request("POST", request.url, json=body, headers=headers)


async def _authorization_server(name: str, endpoint: str, configured: str | None) -> OAuthMetadata:
    """The authorization server's metadata: the `configured` issuer's own (the resource
    server not asked), else the one the server's protected resource metadata names (its
    resource checked); its `issuer` must be the one it was found for."""
    try:
        return await _find_authorization_server(name, endpoint, configured)
    except httpx2.HTTPError as exc:
        raise LoginError(
            f'the metadata of server "{sanitize(name)}" could not be fetched: {sanitize(str(exc))}'
        ) from None
    except ValueError:  # the SDK's models refused a document
        raise LoginError(
            f'server "{sanitize(name)}" or its authorization server publishes metadata that '
            "is not valid"
        ) from None


async def _find_authorization_server(
    name: str, endpoint: str, configured: str | None
) -> OAuthMetadata:
    from mcp.client.auth.utils import (
        build_oauth_authorization_server_metadata_discovery_urls,
        build_protected_resource_metadata_discovery_urls,
    )
    from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata

    resource = canonical_resource(endpoint)
    async with httpx2.AsyncClient(follow_redirects=False, timeout=30.0) as client:
        if configured is not None:
            issuer, base = configured, configured
        else:
            metadata_url = await _discover(name, endpoint)
            prm: ProtectedResourceMetadata | None = None
            for url in build_protected_resource_metadata_discovery_urls(metadata_url, endpoint):
                response = await client.get(url)
                if response.status_code == 200:
                    prm = ProtectedResourceMetadata.model_validate_json(response.content)
                    break
            if prm is None or not prm.authorization_servers:
                raise LoginError(
                    f'server "{sanitize(name)}" publishes no protected resource metadata'
                )
            if canonical_resource(str(prm.resource)) != resource:
                raise LoginError(
                    f'server "{sanitize(name)}" names another resource in its metadata '
                    f"({sanitize(str(prm.resource))}), which is refused"
                )
            issuer, base = str(prm.authorization_servers[0]), endpoint
        oauth: OAuthMetadata | None = None
        for url in build_oauth_authorization_server_metadata_discovery_urls(issuer, base):
            response = await client.get(url)
            if response.status_code == 200:
                oauth = OAuthMetadata.model_validate_json(response.content)
                break
        if oauth is None:
            raise LoginError(
                f'the authorization server of "{sanitize(name)}" publishes no metadata'
            )
        if str(oauth.issuer).rstrip("/") != issuer.rstrip("/"):
            raise LoginError(
                f'the authorization server of "{sanitize(name)}" names another issuer '
                f"({sanitize(str(oauth.issuer))}), which is refused"
            )
    return oauth


def _credentials_first(name: str, settings: AuthSettings) -> tuple[str | None, str | None]:
    """Every credential file of a machine grant read (owner-only, a key that can sign)
    before anything is sent: the client secret, and the signing algorithm of a key."""
    from ._assertions import CredentialError, read_owner_only, signing_algorithm

    where = f'server "{sanitize(name)}"'
    if settings.client_id is None:
        raise LoginError(f"{where}: the {settings.grant} grant needs client_id")
    try:
        secret = (
            read_owner_only(settings.client_secret_file, "client secret file")
            if settings.client_secret_file is not None
            else None
        )
        alg = (
            signing_algorithm(settings.private_key_file, settings.alg)[1]
            if settings.private_key_file is not None
            else None
        )
        if settings.grant == "identity_assertion":
            if not (
                secret and settings.idp_token_endpoint and settings.idp_client_id
                and settings.id_token_file
            ):  # fmt: skip
                raise LoginError(
                    f"{where}: the identity_assertion grant needs client_id, "
                    "client_secret_file, idp_token_endpoint, idp_client_id and id_token_file"
                )
            read_owner_only(settings.id_token_file, "ID token file")
            if settings.idp_client_secret_file is not None:
                read_owner_only(settings.idp_client_secret_file, "identity provider secret file")
    except CredentialError as exc:
        raise LoginError(str(exc)) from None
    if settings.grant == "client_credentials" and (secret is None) == (alg is None):
        raise LoginError(
            f"{where}: the client_credentials grant needs client_id and client_secret_file "
            "or private_key_file"
        )
    return secret, alg


async def _machine_grant(name: str, endpoint: str, settings: AuthSettings) -> TokenRecord:
    """A grant without a person: client credentials (a secret or a signed client
    assertion) or an identity assertion; the credentials from owner-only files."""
    from ._assertions import CredentialError, grant_request

    secret, alg = _credentials_first(name, settings)
    assert settings.client_id is not None
    oauth = await _authorization_server(
        name,
        endpoint,
        settings.authorization_server if settings.grant == "identity_assertion" else None,
    )
    token_endpoint = str(oauth.token_endpoint)
    if settings.grant == "identity_assertion" and _origin(token_endpoint) != _origin(
        str(oauth.issuer)
    ):
        raise LoginError(
            f'the authorization server of "{sanitize(name)}" names a token endpoint on another '
            f"origin ({sanitize(token_endpoint)}), which is refused"
        )
    methods = oauth.token_endpoint_auth_methods_supported or ["client_secret_basic"]
    if alg is not None:
        method = "private_key_jwt"
    else:
        method = "client_secret_basic" if "client_secret_basic" in methods else "client_secret_post"
    record = TokenRecord(
        server=name,
        resource=canonical_resource(endpoint),
        issuer=str(oauth.issuer),
        token_endpoint=token_endpoint,
        client_id=settings.client_id,
        client_secret=secret,
        token_endpoint_auth_method=method,
        scope=settings.scope,
        grant=settings.grant,
        private_key_file=_text(settings.private_key_file),
        signing_alg=alg,
        idp_token_endpoint=settings.idp_token_endpoint,
        idp_client_id=settings.idp_client_id,
        idp_client_secret_file=_text(settings.idp_client_secret_file),
        id_token_file=_text(settings.id_token_file),
    )
    what = "identity assertion" if settings.grant == "identity_assertion" else "client credentials"
    try:
        response = await post_token_request(record, await grant_request(record))
    except CredentialError as exc:
        raise LoginError(f'the login to server "{sanitize(name)}" failed: {exc}') from None
    except httpx2.HTTPError as exc:
        raise LoginError(
            f'the token endpoint of "{sanitize(name)}" could not be reached: {sanitize(str(exc))}'
        ) from None
    if response.status_code != 200:
        error = _error_code(response)
        raise LoginError(
            f'the authorization server of "{sanitize(name)}" refused the {what} '
            f"(HTTP {response.status_code}{', ' + sanitize(error) if error else ''})"
        )
    try:
        return updated_record(record, response)
    except TokenResponseError as exc:
        raise LoginError(f'server "{sanitize(name)}": {exc}') from None


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _without_secrets(text: str) -> str:
    """An SDK error's text, escaped, with its long opaque values (a state, a body) cut."""
    words = [word if len(word) < 40 else word[:8] + "…" for word in sanitize(text).split(" ")]
    return " ".join(words)
