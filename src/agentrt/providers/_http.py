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

import email.utils
import ipaddress
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
import httpx2

from ..accounting import AttemptOutcome
from ..canonical import JSONBoundaryError, canonical_bytes, parse_json
from ..errors import AgentrtError
from ..sanitize import sanitize

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_RESPONSE_BYTES",
    "AttemptError",
    "Endpoint",
    "HTTPAnswer",
    "HTTPClientFactory",
    "KeyHeaders",
    "ProviderError",
    "bearer_key",
    "is_loopback_host",
    "key_from_environment",
    "post_json",
    "retry_after_seconds",
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


class AttemptError(ProviderError):
    """One request failed, classified for the retry loop and the books.

    TRANSIENT_ERROR: 429, 5xx, or no connection (nothing was sent) — worth
    another try, after `retry_after` seconds when the server named them.
    PERMANENT_ERROR: the server refused the request as made (other 4xx, a
    redirect) or answered with a body we cannot use. AMBIGUOUS: the request
    was sent and no answer came back. `charge_in_full`: the provider may have
    billed the whole budget.
    """

    def __init__(
        self,
        message: str,
        outcome: AttemptOutcome,
        *,
        retry_after: float | None = None,
        charge_in_full: bool = False,
    ) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.retry_after = retry_after
        self.charge_in_full = charge_in_full


KeyHeaders = Callable[[str], Mapping[str, str]]
"""The headers that carry a key (`Authorization: Bearer …`, Anthropic's `x-api-key`)."""


def bearer_key(key: str) -> Mapping[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass(frozen=True, slots=True)
class HTTPAnswer:
    """A 2xx answer: its parsed JSON value, the size of the request that got it, and the
    body exactly as it came (what a recording keeps, and a replay sends again)."""

    value: Any
    request_bytes: int
    raw: bytes = b""


def key_from_environment(
    api_key: str | None, base_url: str, *, default_url: str, variable: str
) -> str | None:
    """The key to send: `api_key`, else `variable` — but only for `default_url`.

    A key read from the environment is meant for the provider's own endpoint,
    so it is never handed to another URL by accident; the default endpoint
    without a key is refused in one sentence before any request.
    """
    if api_key is not None or not _same_endpoint(base_url, default_url):
        return api_key
    key = os.environ.get(variable) or None
    if key is None:
        raise ProviderError(
            f"{variable} is not set; the default endpoint {default_url} needs a key"
        )
    return key


def _same_endpoint(base_url: str, default_url: str) -> bool:
    try:
        url = httpx2.URL(base_url)
    except httpx2.InvalidURL:
        return False
    default = httpx2.URL(default_url)
    return url.scheme == "https" and url.host == default.host and url.port in (None, 443)


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
    key_headers: KeyHeaders = bearer_key,
    headers: Mapping[str, str] | None = None,
) -> HTTPAnswer:
    """POST `payload` as canonical JSON to `endpoint` + `path` and return the parsed answer.

    `what` names the endpoint in errors ("the Ollama server at …").  Raises
    `AttemptError` for a redirect, a non-2xx status, a body over `max_bytes`,
    a body that is not one JSON value, or no answer within `deadline` seconds.
    """
    url = endpoint.join(path)
    all_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        # Counting decoded bytes bounds memory only if a small compressed
        # chunk cannot inflate into a huge one; ask for the plain body.
        "Accept-Encoding": "identity",
        **(headers or {}),
    }
    if endpoint.api_key is not None:
        all_headers.update(key_headers(endpoint.api_key))
    body = canonical_bytes(payload)
    client = client_factory() if client_factory is not None else _default_client(endpoint)
    where = f"{what} at {sanitize(endpoint.base_url)}"
    try:
        with anyio.fail_after(deadline):
            async with (
                client,
                client.stream(
                    "POST", url, content=body, headers=all_headers, follow_redirects=False
                ) as response,
            ):
                value, raw = await _read_answer(response, where, max_bytes)
                return HTTPAnswer(value, len(body), raw)
    except TimeoutError:
        raise AttemptError(
            f"{where} did not answer within {_seconds(deadline)}",
            AttemptOutcome.AMBIGUOUS,
            charge_in_full=True,
        ) from None
    except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:
        # No connection, so nothing was sent: safe to try again, nothing to pay.
        raise AttemptError(
            f"{where} could not be reached: {_exception_text(exc)}", AttemptOutcome.TRANSIENT_ERROR
        ) from None
    except httpx2.HTTPError as exc:
        # The connection broke once the request was (being) sent: the model may have run.
        raise AttemptError(
            f"{where} sent no answer (the connection broke after the request was sent):"
            f" {_exception_text(exc)}",
            AttemptOutcome.AMBIGUOUS,
            charge_in_full=True,
        ) from None


def _exception_text(exc: BaseException) -> str:
    return f"{sanitize(type(exc).__name__)}: {sanitize(str(exc))[:_ERROR_SNIPPET_CHARS]}"


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A `Retry-After` header as seconds from now: delta-seconds or an HTTP date; else None."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


async def _read_answer(response: httpx2.Response, where: str, max_bytes: int) -> tuple[Any, bytes]:
    status = response.status_code
    if 300 <= status < 400:
        location = response.headers.get("location", "")
        raise AttemptError(
            f"{where} answered with a redirect ({status}) to"
            f" {sanitize(location)[:_ERROR_SNIPPET_CHARS]!r}; redirects are not followed,"
            " so set the final URL as the base URL",
            AttemptOutcome.PERMANENT_ERROR,
        )
    if not 200 <= status < 300:
        snippet = await _read_bounded(response, _ERROR_SNIPPET_BYTES, truncate=True)
        message = f"{where} answered {status}: {_error_text(snippet)}"
        if status == 429 or 500 <= status < 600:
            raise AttemptError(
                message,
                AttemptOutcome.TRANSIENT_ERROR,
                retry_after=retry_after_seconds(response.headers.get("retry-after")),
            )
        raise AttemptError(message, AttemptOutcome.PERMANENT_ERROR)
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise AttemptError(
            f"{where} sent a body of {declared} bytes, over the {max_bytes} allowed",
            AttemptOutcome.PERMANENT_ERROR,
            charge_in_full=True,
        )
    data = await _read_bounded(response, max_bytes, truncate=False, where=where)
    try:
        return parse_json(data), data
    except JSONBoundaryError as exc:
        raise AttemptError(
            f"{where} sent a body that is not usable JSON: {exc}",
            AttemptOutcome.PERMANENT_ERROR,
            charge_in_full=True,
        ) from None


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
            raise AttemptError(
                f"{where} sent a body over the {limit} bytes allowed",
                AttemptOutcome.PERMANENT_ERROR,
                charge_in_full=True,
            )
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
