"""MCP Apps through the proxy: what a host is offered of a tool's app, and only if it asked.

A tool with an app stays a tool for every host.  Its app — the tool's `_meta`
entries that name it (`ui.resourceUri`, `ui.visibility`, the older
`ui/resourceUri`) and the `ui://` resources — is offered only to a host that
advertised the extension (`capabilities.extensions["io.modelcontextprotocol/ui"]`
with the `text/html;profile=mcp-app` mime type): a host that cannot render
the HTML is not handed it, and its model never sees a tool entry pointing at
a page it cannot show.  A `ui://` read is a resource read like any other
(recorded, under `resource_rules`), and its contents are held to the pin
(`OfferTool`).  What the app then does — the calls it makes through the host
— are the host's `tools/call`s, governed like the model's.  The HTML's
sandbox is the host's (SECURITY.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..mcp._apps import APP_MIME_TYPE, UI_EXTENSION, UI_SCHEME

if TYPE_CHECKING:
    # The SDK's server is imported only when a host needs it (`_dispatch`, decision 0043).
    from mcp.server.context import ServerRequestContext

__all__ = ["host_renders_apps", "is_app_uri", "renders_apps"]


def host_renders_apps(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the host of this request advertised MCP Apps with the HTML mime type."""
    return renders_apps(ctx.session.client_capabilities)


def renders_apps(capabilities: Any) -> bool:
    """Whether client capabilities (the SDK's model, or the wire's object as a dict)
    advertise MCP Apps with the HTML mime type: for a front that has no SDK context."""
    extensions = (
        capabilities.get("extensions")
        if isinstance(capabilities, Mapping)
        else getattr(capabilities, "extensions", None)
    )
    settings = extensions.get(UI_EXTENSION) if isinstance(extensions, Mapping) else None
    if not isinstance(settings, Mapping):
        return False
    mime_types = settings.get("mimeTypes")
    return isinstance(mime_types, list) and APP_MIME_TYPE in mime_types


def is_app_uri(uri: str) -> bool:
    """Whether `uri` names an MCP App (a `ui://` resource)."""
    return uri.startswith(UI_SCHEME)
