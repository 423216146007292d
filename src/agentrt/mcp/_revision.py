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

The header codec and the `x-mcp-header` rules are the official SDK's
(`mcp.shared.inbound`), imported only when a server speaks the revision, so
the client and an SDK server agree on them by construction.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    from mcp.shared.inbound import encode_header_value, mcp_param_headers

    headers = {"mcp-protocol-version": MODERN_REVISION, "mcp-method": method}
    key = _NAME_BEARING.get(method)
    name = params.get(key) if key is not None and params is not None else None
    if isinstance(name, str):
        headers["mcp-name"] = encode_header_value(name)
    if method == "tools/call" and header_map and params is not None:
        arguments = params.get("arguments")
        if isinstance(arguments, dict):
            headers.update(mcp_param_headers(header_map, _plain(arguments)))
    return headers


def _plain(value: Any) -> Any:
    """Arguments as parsed by `parse_json` with each number literal as the SDK renders it
    (a Decimal integer as an int; any other Decimal is a `number`, never mirrored)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else None
    return value


def x_mcp_header_problem(raw_tool: Any) -> str | None:
    """Why a listed tool's `x-mcp-header` annotations are invalid (the spec then has the
    client leave the tool out of its listing), or None."""
    from mcp.shared.inbound import find_invalid_x_mcp_header

    schema = raw_tool.get("inputSchema") if isinstance(raw_tool, dict) else None
    return find_invalid_x_mcp_header(schema)


def x_mcp_header_map(raw_tool: Any) -> dict[tuple[str, ...], str]:
    """Each argument path a valid tool mirrors into a header, to its header token."""
    from mcp.shared.inbound import x_mcp_header_map as header_map

    schema = raw_tool.get("inputSchema") if isinstance(raw_tool, dict) else None
    return header_map(schema)


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
