"""The host side of the 2026-07-28 revision that is not a handler of its own.

Three small rules both of the proxy's fronts (the SDK's server machinery and
any faster path) apply the same way:

- `header_mismatch`: an HTTP request whose routing headers (`Mcp-Method`,
  `Mcp-Name`, `MCP-Protocol-Version`) disagree with its body is refused with
  the revision's `HeaderMismatchError` (-32020, HTTP 400) before anything
  reads it, whichever revision the host speaks: a gateway or a log that
  routes on the header would otherwise see a different call from the one the
  gate records and runs.
- `cache_hints`: the `ttlMs`/`cacheScope` the proxy puts on its own list
  results (decision 0038).
- `wanted_log_level`: the deprecated logging capability as the revision
  keeps it: a host on the new revision asks for a request's log lines in
  that request's `_meta`; a 2025 host sets one level with `logging/setLevel`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from ..canonical import canonical_bytes
from ..sanitize import sanitize

__all__ = [
    "HEADER_MISMATCH",
    "LIST_TTL_MS",
    "cache_hints",
    "header_mismatch",
    "wanted_log_level",
]

# The MCP SDK's `mcp_types.PROTOCOL_VERSION_META_KEY`, `LOG_LEVEL_META_KEY` and
# `mcp_types.jsonrpc.HEADER_MISMATCH` (a test holds them equal), written here so that
# importing this module does not import `mcp_types`' models (issue 36, decision 0057).
PROTOCOL_VERSION_META_KEY: Final = "io.modelcontextprotocol/protocolVersion"
LOG_LEVEL_META_KEY: Final = "io.modelcontextprotocol/logLevel"
HEADER_MISMATCH: Final = -32020

_ROUTING_HEADERS: Final = ("mcp-method", "mcp-name", "mcp-protocol-version")
# How much of a header or a body value a refusal quotes.
_QUOTED: Final = 80

LIST_TTL_MS: Final = 0
"""How long a host may cache the proxy's lists: not at all (decision 0038).  What a host may
see changes without a restart (a re-pin taken live, a tool refused when its server changes
it), and a cached list would offer a refused tool until it expired."""


def _quoted(value: str) -> str:
    text = sanitize(value)
    return text if len(text) <= _QUOTED else text[: _QUOTED - 1] + "…"


def header_mismatch(raw_headers: Iterable[tuple[bytes, bytes]], body: bytes) -> bytes | None:
    """The JSON-RPC `HeaderMismatchError` body for a POST whose routing headers disagree with
    its body (or repeat), or None when they agree or are absent (a 2025 host sends none)."""
    # The SDK's header rules: over HTTP only, where the SDK's server is loaded anyway.
    from mcp.shared.inbound import NAME_BEARING_METHODS, decode_header_value

    seen: dict[str, str] = {}
    for raw_name, raw_value in raw_headers:
        name = raw_name.decode("latin-1").lower()
        if name not in _ROUTING_HEADERS:
            continue
        if name in seen:
            return _error(None, f"the {name} header appears more than once; nothing was run")
        seen[name] = raw_value.decode("latin-1")
    if "mcp-method" not in seen and "mcp-name" not in seen:
        return None  # the SDK's own ladder judges a body that names no route
    try:
        # The transport's own parser (pydantic's), so the check reads the body exactly as
        # the request will be read: with a repeated key, the same (last) value.
        import pydantic_core  # here: only the HTTP front checks headers (issue 36)

        message = pydantic_core.from_json(body)
    except ValueError:
        return None  # not JSON: the transport's parse error answers it
    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
        return None
    request_id = message.get("id")
    method = message["method"]
    said = seen.get("mcp-method")
    if said is not None and said != method:
        return _error(
            request_id,
            f'the Mcp-Method header "{_quoted(said)}" does not match the request\'s method '
            f'"{_quoted(method)}"; nothing was run',
        )
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    key = NAME_BEARING_METHODS.get(method)
    named = seen.get("mcp-name")
    if key is not None and named is not None:
        decoded = decode_header_value(named)
        value = params.get(key)
        if decoded is None or decoded != value:
            return _error(
                request_id,
                f'the Mcp-Name header "{_quoted(named)}" does not match the request\'s {key} '
                f'"{_quoted(str(value))}"; nothing was run',
            )
    meta = params.get("_meta")
    version = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
    header_version = seen.get("mcp-protocol-version")
    if version is not None and header_version is not None and header_version != version:
        return _error(
            request_id,
            f'the MCP-Protocol-Version header "{_quoted(header_version)}" does not match the '
            f'request\'s protocol version "{_quoted(str(version))}"; nothing was run',
        )
    return None


def _error(request_id: Any, message: str) -> bytes:
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        request_id = None
    return canonical_bytes(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {"code": HEADER_MISMATCH, "message": message},
        }
    )


def cache_hints() -> dict[str, Any]:
    """The `ttl_ms` and `cache_scope` (the SDK's names for `ttlMs`/`cacheScope`) of every list
    the proxy answers (decision 0038)."""
    # "private": what a host may see depends on its own session (the extensions it
    # advertised, its taint), so no shared cache may hand one host's list to another.
    return {"ttl_ms": LIST_TTL_MS, "cache_scope": "private"}


def wanted_log_level(
    request_meta: Mapping[str, Any] | None, process_level: str | None, *, stateless: bool
) -> str | None:
    """The level at or above which a server's log lines reach the host during one call.

    A host on the 2026-07-28 revision asks per request (`_meta`'s
    `io.modelcontextprotocol/logLevel`) and must get none it did not ask for; a
    2025 host's `logging/setLevel` holds for the process."""
    if not stateless:
        return process_level
    asked = request_meta.get(LOG_LEVEL_META_KEY) if isinstance(request_meta, Mapping) else None
    return asked if isinstance(asked, str) else None


# The deprecated `includeContext` values (SEP-2596): what the host would attach.
_WIDE_CONTEXT: Final = ("thisServer", "allServers")


def narrowed_sampling(params: Any) -> tuple[Any, str | None]:
    """A server's `sampling/createMessage` params with a deprecated `includeContext` of
    "thisServer" or "allServers" turned to "none" (the revision's migration), and the value
    it had; else the params unchanged and None.

    Behind the proxy either value reaches past the server that asked: to the host, the
    proxy is "this server", so the host would attach the context of every server behind
    it — another server's data handed to this one."""
    if isinstance(params, Mapping) and params.get("includeContext") in _WIDE_CONTEXT:
        return {**params, "includeContext": "none"}, str(params["includeContext"])
    return params, None
