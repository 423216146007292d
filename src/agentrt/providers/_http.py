"""The one way a provider adapter talks HTTP: no redirects, bounded bodies,
a key only where it cannot be read on the wire.

A model endpoint is somebody else's server.  A redirect could carry the
`Authorization` header (or the conversation) to a host the operator never
named, so none is followed; a body without end could exhaust memory, so every
body is counted as it streams; a key sent over plain http to anything but
this machine can be read by whoever sits on the path, so that is refused
before a byte is sent.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
import httpx2

from ..canonical import JSONBoundaryError, canonical_bytes, parse_json
from ..errors import AgentrtError
from ..sanitize import sanitize

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_RESPONSE_BYTES",
    "Endpoint",
    "HTTPClientFactory",
    "ProviderError",
    "is_loopback_host",
    "post_json",
]

MAX_RESPONSE_BYTES: Final = 4 * 1024 * 1024
"""The largest response body (after any decoding) an adapter reads."""

DEFAULT_TIMEOUT: Final = 300.0
"""Seconds one model request may take end to end; a local model can be slow."""

_CONNECT_TIMEOUT: Final = 10.0
_ERROR_SNIPPET_BYTES: Final = 2048
_ERROR_SNIPPET_CHARS: Final = 300

HTTPClientFactory = Callable[[], httpx2.AsyncClient]
"""Returns a new client for one request; the adapter closes it after the request."""


class ProviderError(AgentrtError):
    """A model endpoint could not be used: refused configuration, transport failure,
    an error status, a redirect, an oversized or malformed answer."""


def is_loopback_host(host: str) -> bool:
    """True for `localhost`, an address in 127.0.0.0/8, or `::1` — hosts on this machine."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        return address == ipaddress.IPv6Address("::1")
    return address.is_loopback


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A checked base URL: http or https, no credentials in the URL, and a key
    only over https or to a loopback host."""

    base_url: str
    api_key: str | None

    def __post_init__(self) -> None:
        try:
            url = httpx2.URL(self.base_url)
        except httpx2.InvalidURL:
            raise ProviderError(
                f"the model URL {sanitize(self.base_url)!r} is not a valid URL"
            ) from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ProviderError(
                f"the model URL {sanitize(self.base_url)!r} must be an http:// or https:// URL"
                " with a host"
            )
        if url.userinfo:
            # Credentials in the URL would travel with every request and land in logs.
            raise ProviderError(
                f"the model URL for host {sanitize(url.host)!r} carries credentials;"
                " pass the key as api_key instead"
            )
        if self.api_key is not None and url.scheme == "http" and not is_loopback_host(url.host):
            raise ProviderError(
                f"refusing to send an API key over plain http to {sanitize(url.host)!r};"
                " use https, or a loopback host (127.0.0.1, ::1, localhost)"
            )

    @property
    def url(self) -> httpx2.URL:
        return httpx2.URL(self.base_url)

    def join(self, path: str) -> str:
        """The base URL with `path` appended (the base's own path kept)."""
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")


def _default_client(endpoint: Endpoint) -> httpx2.AsyncClient:
    # Environment proxies are honoured only for https, where a proxy sees a
    # tunnel; over plain http a proxy would read the key and the conversation.
    return httpx2.AsyncClient(
        follow_redirects=False,
        trust_env=endpoint.url.scheme == "https",
        timeout=httpx2.Timeout(DEFAULT_TIMEOUT, connect=_CONNECT_TIMEOUT),
    )


async def post_json(
    endpoint: Endpoint,
    path: str,
    payload: Mapping[str, Any],
    *,
    what: str,
    client_factory: HTTPClientFactory | None = None,
    deadline: float = DEFAULT_TIMEOUT,
    max_bytes: int = MAX_RESPONSE_BYTES,
) -> Any:
    """POST `payload` as canonical JSON to `endpoint` + `path` and return the parsed answer.

    `what` names the endpoint in errors ("the Ollama server at …").  Raises
    `ProviderError` for a redirect, a non-2xx status, a body over `max_bytes`,
    a body that is not one JSON value, or no answer within `deadline` seconds.
    """
    url = endpoint.join(path)
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        # Counting decoded bytes bounds memory only if a small compressed
        # chunk cannot inflate into a huge one; ask for the plain body.
        "Accept-Encoding": "identity",
    }
    if endpoint.api_key is not None:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    body = canonical_bytes(payload)
    client = client_factory() if client_factory is not None else _default_client(endpoint)
    where = f"{what} at {sanitize(endpoint.base_url)}"
    try:
        with anyio.fail_after(deadline):
            async with (
                client,
                client.stream(
                    "POST", url, content=body, headers=headers, follow_redirects=False
                ) as response,
            ):
                return await _read_answer(response, where, max_bytes)
    except TimeoutError:
        raise ProviderError(f"{where} did not answer within {_seconds(deadline)}") from None
    except httpx2.HTTPError as exc:
        raise ProviderError(
            f"{where} could not be reached: {sanitize(type(exc).__name__)}:"
            f" {sanitize(str(exc))[:_ERROR_SNIPPET_CHARS]}"
        ) from None


async def _read_answer(response: httpx2.Response, where: str, max_bytes: int) -> Any:
    status = response.status_code
    if 300 <= status < 400:
        location = response.headers.get("location", "")
        raise ProviderError(
            f"{where} answered with a redirect ({status}) to"
            f" {sanitize(location)[:_ERROR_SNIPPET_CHARS]!r}; redirects are not followed,"
            " so set the final URL as the base URL"
        )
    if not 200 <= status < 300:
        snippet = await _read_bounded(response, _ERROR_SNIPPET_BYTES, truncate=True)
        raise ProviderError(f"{where} answered {status}: {_error_text(snippet)}")
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ProviderError(
            f"{where} sent a body of {declared} bytes, over the {max_bytes} allowed"
        )
    data = await _read_bounded(response, max_bytes, truncate=False, where=where)
    try:
        return parse_json(data)
    except JSONBoundaryError as exc:
        raise ProviderError(f"{where} sent a body that is not usable JSON: {exc}") from None


async def _read_bounded(
    response: httpx2.Response, limit: int, *, truncate: bool, where: str = ""
) -> bytes:
    """Read at most `limit` decoded bytes; past it, cut (`truncate`) or refuse."""
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limit:
            if truncate:
                chunks.append(chunk[: len(chunk) - (total - limit)])
                break
            raise ProviderError(f"{where} sent a body over the {limit} bytes allowed")
        chunks.append(chunk)
    return b"".join(chunks)


def _error_text(snippet: bytes) -> str:
    """The most useful sentence of an error body: its `error.message` or `error`, else the text."""
    text = snippet.decode("utf-8", errors="replace")
    try:
        value = parse_json(snippet)
    except JSONBoundaryError:
        value = None
    if isinstance(value, dict):
        error = value.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
    text = sanitize(text.strip())
    if len(text) > _ERROR_SNIPPET_CHARS:
        text = text[:_ERROR_SNIPPET_CHARS] + "…"
    return text or "(an empty body)"


def _seconds(value: float) -> str:
    return f"{value:g} s" if math.isfinite(value) else "the time allowed"
