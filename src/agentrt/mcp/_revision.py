"""What the 2026-07-28 revision asks of the upstream client, apart from the session itself.

The revision has no handshake: every request carries its protocol version,
the client's identity and capabilities in its `_meta`, and over HTTP mirrors
its method, the name it acts on and the arguments a tool marks with
`x-mcp-header` into headers.  A server tells which revision it speaks in its
answer to `server/discover`, which the client sends first (the spec's
compatibility section; docs/decisions/0036-upstream-revisions.md); anything
that is not positive evidence of a modern server falls back to `initialize`.
A listing may say how long it may be reused (`ttlMs`, `cacheScope`); this
module decides whether and how long the client keeps it.

The header codec and the `x-mcp-header` rules follow the transport page of
the revision, as the official SDK's `mcp.shared.inbound` does (its tests here
run against an SDK server, which rejects a header that disagrees).  They are
not imported from the SDK: importing `mcp` on the event loop while the proxy
imports the SDK's server in a worker thread deadlocks on its module locks.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from ..sanitize import sanitize

__all__ = [
    "DISCOVER_TIMEOUT",
    "LEGACY",
    "MAX_LISTING_TTL_MS",
    "MODERN_REVISION",
    "Discovered",
    "listing_lifetime",
    "read_discover",
    "request_headers",
    "x_mcp_header_problem",
]

MODERN_REVISION: Final = "2026-07-28"
"""The one per-request (stateless) revision this client speaks."""

LEGACY: Final = "legacy"
"""`read_discover`'s verdict for a server to be spoken to over the `initialize` handshake."""

DISCOVER_TIMEOUT: Final = 5.0
"""How long the `server/discover` probe waits before the server is taken for a legacy one
(the SDK waits 10 s; half the default connect budget here, and never more than half of
what the caller has left)."""

MAX_LISTING_TTL_MS: Final = 300_000
"""The longest a listing is reused, whatever `ttlMs` says: five minutes."""

UNSUPPORTED_PROTOCOL_VERSION: Final = -32022
HEADER_MISMATCH: Final = -32020

META_PROTOCOL_VERSION: Final = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_INFO: Final = "io.modelcontextprotocol/clientInfo"
META_CLIENT_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO: Final = "io.modelcontextprotocol/serverInfo"

# Method → the params member mirrored into `Mcp-Name` (the SDK's NAME_BEARING_METHODS).
_NAME_BEARING: Final = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


@dataclass(frozen=True, slots=True)
class Discovered:
    """A server's answer to `server/discover` read as modern: its capabilities and identity."""

    capabilities: Any
    server_info: Any


def read_discover(server: str, result: Any) -> Discovered | str:
    """`Discovered` when `result` is a discover result naming this client's revision, else
    `LEGACY` (not positive evidence of a modern server: the client falls back)."""
    if not isinstance(result, dict):
        return LEGACY
    versions = result.get("supportedVersions")
    if not isinstance(versions, list) or MODERN_REVISION not in versions:
        return LEGACY
    capabilities = result.get("capabilities")
    if not isinstance(capabilities, dict):
        return LEGACY
    meta = result.get("_meta")
    info = meta.get(META_SERVER_INFO) if isinstance(meta, dict) else None
    return Discovered(capabilities=capabilities, server_info=info)


def unsupported_versions(code: int, data: Any) -> list[str] | None:
    """The `supported` list of an `UnsupportedProtocolVersionError`, or None if it is not one."""
    if code != UNSUPPORTED_PROTOCOL_VERSION:
        return None
    supported = data.get("supported") if isinstance(data, dict) else None
    if not isinstance(supported, list) or not all(isinstance(v, str) for v in supported):
        return None
    return supported


def envelope(client_info: Mapping[str, Any], capabilities: Mapping[str, Any]) -> dict[str, Any]:
    """The `_meta` members every modern request carries."""
    return {
        META_PROTOCOL_VERSION: MODERN_REVISION,
        META_CLIENT_INFO: dict(client_info),
        META_CLIENT_CAPABILITIES: dict(capabilities),
    }


def request_headers(
    method: str, params: Mapping[str, Any] | None, header_map: Mapping[Any, str] | None
) -> dict[str, str]:
    """The HTTP headers mirroring a modern request: `MCP-Protocol-Version`, `Mcp-Method`,
    `Mcp-Name` for the methods that name something, and `Mcp-Param-*` for the arguments of
    a `tools/call` whose tool marks them with `x-mcp-header` (`header_map`, from its listing)."""
    headers = {"mcp-protocol-version": MODERN_REVISION, "mcp-method": method}
    key = _NAME_BEARING.get(method)
    name = params.get(key) if key is not None and params is not None else None
    if isinstance(name, str):
        headers["mcp-name"] = encode_header_value(name)
    if method == "tools/call" and header_map and params is not None:
        arguments = params.get("arguments")
        if isinstance(arguments, dict):
            for path, token in header_map.items():
                rendered = _rendered(_value_at(arguments, path))
                if rendered is not None:
                    headers[f"mcp-param-{token}"] = encode_header_value(rendered)
    return headers


_SENTINEL: Final = re.compile(r"^=\?base64\?.*\?=$", re.DOTALL)
_HEADER_SAFE: Final = re.compile(r"^[\x20-\x7e]*$")
_TOKEN: Final = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_MIRRORABLE: Final = frozenset({"string", "integer", "boolean"})
# Keywords whose values are schemas reached other than through `properties` (a header
# annotation below them is not statically reachable), by the shape of their value.
_SUBSCHEMA: Final = frozenset(
    {"items", "contains", "unevaluatedItems", "additionalProperties", "propertyNames",
     "unevaluatedProperties", "not", "if", "then", "else", "contentSchema"}
)  # fmt: skip
_SUBSCHEMA_LIST: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SUBSCHEMA_MAP: Final = frozenset({"patternProperties", "dependentSchemas", "$defs", "definitions"})


def encode_header_value(value: str) -> str:
    """`value` as a header value: verbatim when it is visible ASCII without edge spaces and
    does not look like the sentinel, else `=?base64?...?=` of its UTF-8 bytes."""
    if _HEADER_SAFE.match(value) and value == value.strip() and not _SENTINEL.match(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


def _rendered(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return str(int(value))
    return None


def _value_at(arguments: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = arguments
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _positions(schema: Any) -> Iterator[tuple[tuple[str, ...] | None, dict[str, Any]]]:
    """Every schema position under `schema`, with its chain of `properties` keys from the
    root (None once any other keyword was crossed).  `$ref` is not followed."""
    stack: list[tuple[tuple[str, ...] | None, Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield path, node
        for keyword, value in node.items():
            if keyword == "properties" and isinstance(value, dict):
                for name, sub in value.items():
                    stack.append((None if path is None else (*path, name), sub))
            elif keyword in _SUBSCHEMA:
                stack.append((None, value))
            elif keyword in _SUBSCHEMA_LIST and isinstance(value, list):
                stack.extend((None, sub) for sub in value)
            elif keyword in _SUBSCHEMA_MAP and isinstance(value, dict):
                stack.extend((None, sub) for sub in value.values())


def x_mcp_header_problem(raw_tool: Any) -> str | None:
    """Why a listed tool's `x-mcp-header` annotations are invalid (the spec then has the
    client leave the tool out of its listing), or None: each must sit on a property reached
    through `properties` alone, be an HTTP token, unique regardless of case, on a string,
    integer or boolean property."""
    schema = raw_tool.get("inputSchema") if isinstance(raw_tool, dict) else None
    seen: set[str] = set()
    for path, position in _positions(schema):
        if "x-mcp-header" not in position:
            continue
        token = position["x-mcp-header"]
        if not path:
            return "an x-mcp-header is not on a property reached through properties alone"
        where = sanitize(".".join(path))
        if not isinstance(token, str) or not _TOKEN.match(token):
            return f'the x-mcp-header of property "{where}" is not an HTTP header token'
        if position.get("type") not in _MIRRORABLE:
            return f'property "{where}" has an x-mcp-header but is not a string, integer or boolean'
        if token.lower() in seen:
            return f'the x-mcp-header of property "{where}" repeats another one'
        seen.add(token.lower())
    return None


def x_mcp_header_map(raw_tool: Any) -> dict[tuple[str, ...], str]:
    """Each argument path a valid tool mirrors into a header, to its header token."""
    schema = raw_tool.get("inputSchema") if isinstance(raw_tool, dict) else None
    return {
        path: position["x-mcp-header"]
        for path, position in _positions(schema)
        if path and isinstance(position.get("x-mcp-header"), str)
    }


def listing_lifetime(server: str, method: str, result: Any) -> tuple[float, str | None]:
    """How many seconds a modern listing page may be reused, and the sentence saying why
    it is not when its hints are bad (None when they are fine or absent).

    No `ttlMs`, or zero: not reused.  A negative or non-numeric one, or a
    `cacheScope` other than "public" or "private": not reused, and said.  One over
    `MAX_LISTING_TTL_MS`: reused that long at most.  The cache is per connection, which
    serves one configured server for one operator, so both scopes may be kept."""
    if not isinstance(result, dict):
        return 0.0, None
    name = sanitize(server)
    scope = result.get("cacheScope")
    if scope is not None and scope not in ("public", "private"):
        shown = sanitize(scope) if isinstance(scope, str) else type(scope).__name__
        return 0.0, (
            f'server "{name}" gave its {method} the cacheScope "{shown}", which is neither '
            '"public" nor "private"; the listing is not reused'
        )
    ttl = result.get("ttlMs")
    if ttl is None:
        return 0.0, None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, Decimal)) or ttl < 0:
        shown = sanitize(str(ttl)) if isinstance(ttl, (int, Decimal, str)) else type(ttl).__name__
        return 0.0, (
            f'server "{name}" gave its {method} a ttlMs of {shown}, which is not a '
            "lifetime in milliseconds; the listing is not reused"
        )
    return min(float(ttl), float(MAX_LISTING_TTL_MS)) / 1000.0, None


def era(revision: str | None) -> str:
    """ "modern" for the per-request revision, "legacy" for a handshake one."""
    return "modern" if revision == MODERN_REVISION else "legacy"


def revision_change(server: str, pinned: str | None, spoken: str | None) -> str | None:
    """The sentence refusing a server that now speaks the other era than it was pinned
    over (modern against legacy), or None: a manifest without a revision, or the same era
    (a legacy server choosing a newer handshake version is not a change of era)."""
    if pinned is None or spoken is None or era(pinned) == era(spoken):
        return None
    return (
        f'server "{sanitize(server)}" now speaks protocol revision {sanitize(spoken)} but was '
        f"pinned over {sanitize(pinned)}; it is refused until `agentrt pin` is run again "
        "and the result reviewed"
    )


def without_transport_members(result: Any, *, keep_hints: bool) -> Any:
    """A modern result without what the revision adds for the client itself: `resultType`
    "complete" (an input-required result keeps it: the client acts on it), the server's
    identity stamped in `_meta` (dropped with `_meta` when nothing else is in it), and,
    unless `keep_hints`, `ttlMs` and `cacheScope`.  What is left is the result a legacy
    session would carry, so results, like pins, do not depend on the revision."""
    if not isinstance(result, dict):
        return result
    trimmed = dict(result)
    if trimmed.get("resultType") == "complete":
        del trimmed["resultType"]
    meta = trimmed.get("_meta")
    if isinstance(meta, dict) and META_SERVER_INFO in meta:
        rest = {key: value for key, value in meta.items() if key != META_SERVER_INFO}
        if rest:
            trimmed["_meta"] = rest
        else:
            del trimmed["_meta"]
    if not keep_hints:
        trimmed.pop("ttlMs", None)
        trimmed.pop("cacheScope", None)
    return trimmed


def refused_before_running(code: int, http_status: int | None) -> bool:
    """Whether an error answer proves its request did not run: a `HeaderMismatchError`
    (-32020) carried by an HTTP 400, which the revision has a server send when it rejects
    the request's headers, before dispatching it to any handler.  The same code inside an
    event stream proves nothing (the server may have begun)."""
    return code == HEADER_MISMATCH and http_status == 400
