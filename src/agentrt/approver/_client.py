"""A client of the signed approver channel: requests signed as the server checks them."""

from __future__ import annotations

import json as json_module
from typing import TYPE_CHECKING, Any

from ._signing import signed_headers

if TYPE_CHECKING:
    import httpx2

__all__ = ["signed_request"]


def signed_request(
    method: str,
    url: str,
    *,
    secret: bytes,
    json: Any = None,
    content: bytes = b"",
    headers: dict[str, str] | None = None,
    now: float | None = None,
) -> httpx2.Request:
    """An `httpx2.Request` to `url` signed with `secret` now (send it with a client's `send`).

    The path signed is the URL's path exactly as sent (percent-encoded, without its
    query); `json`, if given, is the body (compact, UTF-8) with its content type.
    """
    import httpx2

    extra = dict(headers or {})
    if json is not None:
        content = json_module.dumps(json, separators=(",", ":"), ensure_ascii=False).encode()
        extra.setdefault("Content-Type", "application/json")
    target = httpx2.URL(url)
    path = target.raw_path.decode("ascii").partition("?")[0]
    extra.update(signed_headers(secret, method, path, content, now=now))
    return httpx2.Request(method.upper(), target, content=content, headers=extra)
