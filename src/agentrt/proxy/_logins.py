"""Which proxied tools belong to a remote server reached with OAuth tokens, and the check
each call to one makes before it enters the gate (docs/oauth.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tools import Tool
    from .config import UpstreamConfig

__all__ = ["oauth_preflights"]


def oauth_preflights(
    tools: Sequence[tuple[Tool, UpstreamConfig]],
) -> dict[str, Callable[[], Awaitable[str | None]]]:
    """Each tool of an OAuth server by name: a check that says why its server waits for
    `agentrt login`, or None when its tokens serve (refreshed first when near their end)."""
    checks: dict[str, Callable[[], Awaitable[str | None]]] = {}
    for tool, upstream in tools:
        factory = upstream.server.http_client_factory
        if factory is None:
            continue  # no HTTP client of its own: the OAuth module (and httpx2) stays unloaded
        from ..mcp._oauth import OAuthClientFactory

        if isinstance(factory, OAuthClientFactory):
            checks[tool.spec.name] = factory.session.preflight
    return checks
