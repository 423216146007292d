"""A remote server's OAuth tokens at work: attached, refreshed, never handed elsewhere.

`OAuthSession` is one server's tokens inside one process.  Its `auth` is the
`httpx2.Auth` of that server's HTTP client (`open_http`): it sends the
stored access token as `Authorization: Bearer` to the server's own origin
and nowhere else, refreshes it before it ends, and never authorizes by
itself.  The SDK's `OAuthClientProvider` runs the whole browser flow when a
request is refused; a proxy serving a host cannot open a browser, and a
wider scope must be granted by a person, so here (docs/decisions/0035):

- no token, a `401`, or a refresh the authorization server refuses (an
  expired, revoked or already used refresh token): the request is not sent
  again, the call fails with `NeedsLogin` ("nothing ran"), one stderr line
  names `agentrt login NAME`, and later calls fail the same way at once
  until a login writes new tokens, which the next call reads;
- a `403` with `error="insufficient_scope"`: `ScopeNotGranted`, the wanted
  scope remembered in the token file for the next login to ask for, never
  a silent re-authorization with a wider scope;
- a refresh is made under the token file's lock, after rereading it, so
  of two processes the second uses the first one's new tokens; the token
  endpoint's redirect is not followed (it would carry the refresh token).
"""

from __future__ import annotations

import base64
import json
import sys
import time
import urllib.parse
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import httpx2

from ..sanitize import sanitize
from ._connection_errors import NotSent
from ._tokens import TokenFile, TokenRecord, TokenStoreError, token_file

__all__ = [
    "NeedsLogin",
    "OAuthClientFactory",
    "OAuthSession",
    "ScopeNotGranted",
    "canonical_resource",
    "oauth_client_factory",
]

# A token is refreshed when less than this much of its life is left (or a quarter of
# its whole life, for a short-lived one).
_REFRESH_MARGIN: Final = 60.0
_TOKEN_TIMEOUT: Final = httpx2.Timeout(30.0)
_CLIENT_TIMEOUT: Final = httpx2.Timeout(30.0, read=300.0)


class NeedsLogin(NotSent):
    """The server needs `agentrt login NAME` before any request to it is sent."""


class ScopeNotGranted(NotSent):
    """The server refused a request for a scope the operator has not granted; nothing ran."""


def canonical_resource(endpoint: str) -> str:
    """The server's canonical URI (RFC 8707, MCP authorization): lower-case scheme and
    host, no fragment, no trailing slash unless the path is only one."""
    parts = urllib.parse.urlsplit(endpoint)
    path = parts.path if parts.path not in ("", "/") else ""
    return urllib.parse.urlunsplit(
        (parts.scheme.lower(), parts.netloc.lower(), path, parts.query, "")
    )


def _origin(url: str | httpx2.URL) -> tuple[str, str, int | None]:
    parsed = httpx2.URL(str(url))
    default = {"http": 80, "https": 443}.get(parsed.scheme)
    return parsed.scheme, parsed.host, parsed.port or default


def login_hint(name: str) -> str:
    return f"agentrt login {sanitize(name)}"


@dataclass(slots=True)
class OAuthSession:
    """One remote server's OAuth state in this process.

    `warn` receives the one stderr line a broken login earns (default: stderr).
    """

    name: str
    endpoint: str
    file: TokenFile
    # The rest is this process's state, not what the session is: two readings of one
    # configuration compare equal (a rules change is not taken for a changed server).
    warn: Callable[[str], None] | None = field(default=None, compare=False)
    _lock: anyio.Lock = field(default_factory=anyio.Lock, compare=False)
    _broken: str | None = field(default=None, compare=False)
    _record: TokenRecord | None = field(default=None, compare=False)
    _mtime: float | None = field(default=None, compare=False)

    @classmethod
    def for_server(cls, name: str, endpoint: str) -> OAuthSession:
        return cls(name, endpoint, token_file(name, canonical_resource(endpoint)))

    @property
    def resource(self) -> str:
        return canonical_resource(self.endpoint)

    def _say(self, line: str) -> None:
        if self.warn is not None:
            self.warn(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def _needs_login(self, why: str) -> NeedsLogin:
        name = sanitize(self.name)
        message = f'server "{name}" needs `{login_hint(self.name)}`: {why}'
        if self._broken != why:
            self._broken = why
            self._say(f"agentrt: {message}")
        return NeedsLogin(self.name, message)

    async def _load(self) -> TokenRecord | None:
        """The token file's record, reread (in a worker) only when the file changed: a
        login since, or another process's refresh."""
        try:
            mtime = self.file.path.stat().st_mtime_ns
        except FileNotFoundError:
            self._record, self._mtime = None, None
            return None
        if mtime != self._mtime or self._record is None:
            self._record = await anyio.to_thread.run_sync(self.file.read)
            self._mtime = mtime
            if self._record is not None:
                self._broken = None  # a login wrote new tokens: try them
        return self._record

    async def waiting_for_login(self) -> str | None:
        """Why this server waits for a login, or None when its tokens may serve."""
        try:
            record = await self._load()
        except TokenStoreError as exc:
            return str(exc)
        if record is None:
            return "no login has been made for it"
        return self._broken

    async def access_token(self) -> str | None:
        """A current access token (refreshed first when near its end), or None when no login
        was ever made.  Raises `NeedsLogin` when the stored tokens cannot serve."""
        async with self._lock:
            try:
                record = await self._load()
            except TokenStoreError as exc:
                raise self._needs_login(str(exc)) from None
            if record is None:
                return None
            if self._broken is not None:
                raise self._needs_login(self._broken)
            if record.resource != self.resource:
                raise self._needs_login("its tokens were issued for another resource")
            if not _near_end(record):
                return record.access_token
            return (await self._refresh()).access_token

    async def preflight(self) -> str | None:
        """Why a call to this server cannot be sent now (it needs a login), or None; a
        token near its end is refreshed here, before the call is recorded."""
        try:
            await self.access_token()
        except NeedsLogin as exc:
            return str(exc)
        return None

    async def _refresh(self, refused: str | None = None) -> TokenRecord:
        """Refresh under the file's lock, unless the file (reread under it) already holds
        a token that is not near its end and is not `refused` (the one a server refused)."""
        async with self.file.locked():
            try:
                # Another process may have refreshed meanwhile.
                record = await anyio.to_thread.run_sync(self.file.read)
            except TokenStoreError as exc:
                raise self._needs_login(str(exc)) from None
            if record is None:
                raise self._needs_login("its token file was removed")
            if not _near_end(record) and record.access_token != refused:
                self._record, self._mtime = record, self.file.path.stat().st_mtime_ns
                return record
            fresh = await self._token_request(record)
            await anyio.to_thread.run_sync(self.file.write, fresh)
            self._record, self._mtime = fresh, self.file.path.stat().st_mtime_ns
            return fresh

    async def after_refusal(self, refused: str) -> str:
        """A new access token after the server refused `refused` with 401 (revoked, or
        ended early by the server's clock); raises `NeedsLogin` when none can be had."""
        async with self._lock:
            if self._broken is not None:
                raise self._needs_login(self._broken)
            return (await self._refresh(refused)).access_token

    async def _token_request(self, record: TokenRecord) -> TokenRecord:
        if record.grant == "client_credentials" or (
            record.grant == "identity_assertion" and not record.refresh_token
        ):
            # Made again without a person (docs/decisions/0045).
            from ._assertions import CredentialError, grant_request

            try:
                data = await grant_request(record)
            except CredentialError as exc:
                raise self._needs_login(str(exc)) from None
        elif record.refresh_token:
            data = {
                "grant_type": "refresh_token",
                "refresh_token": record.refresh_token,
                "resource": record.resource,
            }
        else:
            raise self._needs_login("its access token ended and there is no refresh token")
        response = await post_token_request(record, data)
        if 300 <= response.status_code < 400:
            raise self._needs_login(
                "its authorization server answered the refresh with a redirect, which is not "
                "followed (it would carry the refresh token elsewhere)"
            )
        if response.status_code != 200:
            error = _error_code(response)
            raise self._needs_login(
                f"its authorization server refused the refresh (HTTP {response.status_code}"
                f"{', ' + sanitize(error) if error else ''})"
            )
        try:
            return updated_record(record, response)
        except TokenResponseError as exc:
            raise self._needs_login(str(exc)) from None

    async def note_wanted_scope(self, scope: str) -> None:
        """Remember a scope the server asked for, for the next login to ask the person."""
        async with self.file.locked():
            await anyio.to_thread.run_sync(self._add_wanted_scope, scope)

    def _add_wanted_scope(self, scope: str) -> None:
        with _suppress_store_errors():
            record = self.file.read()
            if record is not None:
                record.wanted_scope = _union(record.wanted_scope, scope)
                self.file.write(record)

    def auth(self) -> _SessionAuth:
        return _SessionAuth(self)

    def client(self) -> httpx2.AsyncClient:
        """A new HTTP client for one connection, carrying this session's tokens."""
        return httpx2.AsyncClient(auth=self.auth(), follow_redirects=False, timeout=_CLIENT_TIMEOUT)


class _suppress_store_errors:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> bool:
        return kind is not None and issubclass(kind, TokenStoreError)


@dataclass(frozen=True, slots=True)
class OAuthClientFactory:
    """A `Server.http_client_factory` whose clients carry `session`'s tokens."""

    session: OAuthSession

    def __call__(self) -> httpx2.AsyncClient:
        return self.session.client()


class _SessionAuth(httpx2.Auth):
    """Attach the session's token to requests for the server's own origin; refuse on 401/403."""

    def __init__(self, session: OAuthSession) -> None:
        self.session = session

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        session = self.session
        # A host's Authorization never reaches the server through this client.
        request.headers.pop("authorization", None)
        same_origin = _origin(request.url) == _origin(session.endpoint)
        token = await session.access_token() if same_origin else None
        if token is not None:
            request.headers["authorization"] = f"Bearer {token}"
        response = yield request
        if not same_origin:
            return
        if response.status_code == 401:
            if token is None:
                raise session._needs_login(
                    "it answered 401: it needs an OAuth login and none has been made"
                )
            # Refused before it was read: sent once more with a refreshed token.
            token = await session.after_refusal(token)
            request.headers["authorization"] = f"Bearer {token}"
            response = yield request
            if response.status_code == 401:
                raise session._needs_login("it refused a freshly refreshed token (HTTP 401)")
        if response.status_code == 403:
            challenge = _challenge(response.headers.get("www-authenticate", ""))
            if challenge.get("error") == "insufficient_scope":
                scope = challenge.get("scope", "")
                await session.note_wanted_scope(scope)
                name = sanitize(session.name)
                message = (
                    f'server "{name}" refused the call: it needs a permission the operator has '
                    f"not granted (scope {sanitize(scope)!r}); a person must run "
                    f"`{login_hint(session.name)}` to grant it"
                )
                session._say(f"agentrt: {message}")
                raise ScopeNotGranted(session.name, message)


async def post_token_request(record: TokenRecord, data: dict[str, str]) -> httpx2.Response:
    """POST `data` to the record's token endpoint with its client's authentication;
    redirects are not followed (a redirect would carry a secret elsewhere)."""
    headers = {"content-type": "application/x-www-form-urlencoded", "accept": "application/json"}
    data = dict(data)
    method = record.token_endpoint_auth_method
    if record.client_secret and method == "client_secret_basic":
        credentials = (
            f"{urllib.parse.quote(record.client_id, safe='')}:"
            f"{urllib.parse.quote(record.client_secret, safe='')}"
        )
        headers["authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    else:
        data["client_id"] = record.client_id
        if record.client_secret:
            data["client_secret"] = record.client_secret
    async with httpx2.AsyncClient(follow_redirects=False, timeout=_TOKEN_TIMEOUT) as client:
        response = await client.post(record.token_endpoint, data=data, headers=headers)
        await response.aread()
        return response


def updated_record(record: TokenRecord, response: httpx2.Response) -> TokenRecord:
    """The record with a token response's new tokens (the old refresh token kept when the
    server does not rotate it, the old scope when it names none).  Parsed here rather than
    with the SDK's model: importing the SDK on the event loop's thread while the proxy's
    worker imports it too can deadlock on the import lock."""
    try:
        value = json.loads(response.content)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise TokenResponseError("the token endpoint's answer is not a JSON object")
    access = value.get("access_token")
    token_type = value.get("token_type", "Bearer")
    expires_in = value.get("expires_in")
    refresh = value.get("refresh_token")
    scope = value.get("scope")
    if not isinstance(access, str) or not access:
        raise TokenResponseError("the token endpoint's answer has no access_token")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise TokenResponseError("the token endpoint's answer is not a Bearer token")
    if expires_in is not None and (type(expires_in) is not int or expires_in < 0):
        raise TokenResponseError(
            "the token endpoint's answer has an expires_in that is not a count"
        )
    if refresh is not None and not isinstance(refresh, str):
        raise TokenResponseError("the token endpoint's answer has a refresh_token that is not text")
    if scope is not None and not isinstance(scope, str):
        raise TokenResponseError("the token endpoint's answer has a scope that is not text")
    now = time.time()
    return TokenRecord(
        **{
            **record.to_json(),
            "access_token": access,
            "refresh_token": refresh or record.refresh_token,
            "expires_at": now + expires_in if expires_in else None,
            "issued_at": now,
            "scope": scope or record.scope,
        }
    )


class TokenResponseError(ValueError):
    """A token endpoint answered 200 with something that is not a token response."""


def _near_end(record: TokenRecord) -> bool:
    if record.expires_at is None:
        return False
    life = record.expires_at - (record.issued_at or record.expires_at - 4 * _REFRESH_MARGIN)
    margin = min(_REFRESH_MARGIN, life / 4)
    return time.time() >= record.expires_at - margin


def _union(first: str | None, second: str | None) -> str:
    scopes: list[str] = []
    for scope in f"{first or ''} {second or ''}".split():
        if scope not in scopes:
            scopes.append(scope)
    return " ".join(scopes)


def _challenge(header: str) -> dict[str, str]:
    """The parameters of a `Bearer` WWW-Authenticate challenge."""
    import re

    return {
        match.group(1).lower(): match.group(2) if match.group(2) is not None else match.group(3)
        for match in re.finditer(r'([A-Za-z_]+)\s*=\s*(?:"([^"]*)"|([^\s,]+))', header)
    }


def _error_code(response: httpx2.Response) -> str:
    try:
        value = response.json()
    except ValueError:
        return ""
    error = value.get("error") if isinstance(value, dict) else None
    return error if isinstance(error, str) else ""


def oauth_client_factory(name: str, endpoint: str) -> OAuthClientFactory:
    """The HTTP client factory of a remote server reached with OAuth tokens."""
    return OAuthClientFactory(OAuthSession.for_server(name, endpoint))


async def needs_login(server: Any) -> str | None:
    """Why `server` waits for `agentrt login` (its 401, or tokens that cannot serve), or
    None.  Asks the server only when it is reached with OAuth and has no usable tokens; a
    server that answers without a token needs no login.  For the commands that would
    otherwise fail on something else first (a manifest not yet written)."""
    factory = getattr(server, "http_client_factory", None)
    if (
        not isinstance(factory, OAuthClientFactory)
        or await factory.session.waiting_for_login() is None
    ):
        return None
    from ._connection import connect

    try:
        with anyio.fail_after(server.connect_timeout):
            connection = await connect(server)
    except NeedsLogin as exc:
        return str(exc)
    except Exception:  # unreachable or broken: what follows reports it in its own words
        return None
    await connection.aclose()
    return None
