"""The `initialize` request a stdio connection opens with, written where both its senders
read it: the connection's handshake (`_connection`) and the early start (`_spawn`), which
sends it the moment a server is spawned (issue 36, decision 0062)."""

from __future__ import annotations

from typing import Final

from .._version import VERSION
from ..canonical import canonical_json
from ._jsonrpc import encode_request
from ._server import Server

__all__ = [
    "FIRST_REQUEST_ID",
    "HANDSHAKE_PROTOCOL_VERSIONS",
    "LATEST_HANDSHAKE_VERSION",
    "client_info",
    "initialize_params",
    "initialize_request",
    "opens_with_initialize",
]

HANDSHAKE_PROTOCOL_VERSIONS: Final = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
"""The `initialize` handshake's protocol versions this client speaks, oldest first: the MCP
SDK's `mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS` (a test holds them equal), written
here so that a handshake never waits for `mcp_types`' models to be built (issue 36)."""

LATEST_HANDSHAKE_VERSION: Final = HANDSHAKE_PROTOCOL_VERSIONS[-1]

FIRST_REQUEST_ID: Final = 1
"""The id of a connection's first request (its ids count up from it)."""


def client_info() -> dict[str, str]:
    return {"name": "agentrt", "version": VERSION}


def initialize_params(server: Server) -> str:
    """The handshake's params, as JSON text."""
    return canonical_json(
        {
            "protocolVersion": LATEST_HANDSHAKE_VERSION,
            # No sampling, roots or elicitation unless a caller answers them.
            "capabilities": dict(server.client_capabilities or {}),
            "clientInfo": client_info(),
        }
    )


def opens_with_initialize(server: Server) -> bool:
    """Whether a connection to `server` sends `initialize` first (every revision mode but
    "auto", which probes with `server/discover`)."""
    return server.revision != "auto"


def initialize_request(server: Server) -> bytes:
    """The connection's first request to a server it opens with the handshake."""
    return encode_request(FIRST_REQUEST_ID, "initialize", initialize_params(server))
