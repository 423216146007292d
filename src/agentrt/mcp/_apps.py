"""MCP Apps (`io.modelcontextprotocol/ui`): a tool's HTML app, pinned like its description.

A tool names its app in its listing's `_meta.ui.resourceUri` (older servers:
`_meta["ui/resourceUri"]`), a `ui://` resource whose contents (HTML of mime
type `text/html;profile=mcp-app`, with the app's CSP and sandbox permissions
in the content's `_meta.ui`) a host renders.  `pin` reads each app once and
keeps the SHA-256 of its contents as read (`PinnedApp`); `load` reads it
again and refuses the tools of an app that changed, or a tool that now names
another app, as a changed description is refused.  A tool whose app was
never pinned is offered without it.  What a host is then sent, and to whom,
is the proxy's (`proxy/_apps.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..canonical import canonical_bytes, sha256_hex
from ..sanitize import sanitize

if TYPE_CHECKING:  # the manifest reads `PinnedApp` without the client's imports
    from ._connection import Connection

__all__ = [
    "APP_MIME_TYPE",
    "UI_EXTENSION",
    "PinnedApp",
    "app_content_hash",
    "pin_apps",
    "ui_meta_of",
    "ui_resource_of",
]

UI_EXTENSION: Final = "io.modelcontextprotocol/ui"
"""The extension's identifier, under a host's `capabilities.extensions`."""
APP_MIME_TYPE: Final = "text/html;profile=mcp-app"
UI_SCHEME: Final = "ui://"
_LEGACY_KEY: Final = "ui/resourceUri"


@dataclass(frozen=True, slots=True)
class PinnedApp:
    """One `ui://` resource as read when pinned: the SHA-256 hex of its `contents` (canonical
    JSON of the read result's `contents`, literals kept), and the tools that name it."""

    uri: str
    content_hash: str
    tools: tuple[str, ...]


def ui_meta_of(raw_tool: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `_meta` entries of a listed tool that belong to MCP Apps (`ui`, and the older
    `ui/resourceUri`), as listed; None when it names no `ui://` app."""
    meta = raw_tool.get("_meta")
    if not isinstance(meta, Mapping) or ui_resource_of(raw_tool) is None:
        return None
    return {key: meta[key] for key in ("ui", _LEGACY_KEY) if key in meta}


def ui_resource_of(raw_tool: Mapping[str, Any]) -> str | None:
    """The `ui://` URI of the app a listed tool names, or None."""
    meta = raw_tool.get("_meta")
    if not isinstance(meta, Mapping):
        return None
    ui = meta.get("ui")
    uri = ui.get("resourceUri") if isinstance(ui, Mapping) else None
    if uri is None:
        uri = meta.get(_LEGACY_KEY)
    return uri if isinstance(uri, str) and uri.startswith(UI_SCHEME) else None


def app_content_hash(result: Any) -> str | None:
    """The SHA-256 hex of a `resources/read` result's `contents`, or None if it has none."""
    contents = result.get("contents") if isinstance(result, Mapping) else None
    if not isinstance(contents, list) or not contents:
        return None
    return sha256_hex(canonical_bytes(contents))


async def read_app(connection: Connection, uri: str, timeout: float) -> str:  # noqa: ASYNC109
    """Read one app and return its content hash; raises `ValueError` naming what is wrong."""
    result = await connection.request("resources/read", {"uri": uri}, timeout=timeout)
    digest = app_content_hash(result)
    if digest is None:
        raise ValueError(f"reading the app {sanitize(uri)} returned no contents")
    return digest


async def pin_apps(
    connection: Connection,
    raw_tools: Iterable[tuple[str, Mapping[str, Any]]],
    listed_resources: Iterable[str],
    timeout: float,  # noqa: ASYNC109 - bounds each read
) -> tuple[dict[str, PinnedApp], list[str]]:
    """Each app the tools name, and each listed `ui://` resource, read and pinned; with one
    line for each that could not be read (left unpinned: its tools are offered without it)."""
    tools_of: dict[str, list[str]] = {}
    for name, raw in raw_tools:
        uri = ui_resource_of(raw)
        if uri is not None:
            tools_of.setdefault(uri, []).append(name)
    for uri in listed_resources:
        if uri.startswith(UI_SCHEME):
            tools_of.setdefault(uri, [])
    apps: dict[str, PinnedApp] = {}
    lines: list[str] = []
    for uri, names in sorted(tools_of.items()):
        try:
            digest = await read_app(connection, uri, timeout)
        except Exception as exc:
            lines.append(f"the app {sanitize(uri)} was not pinned: {sanitize(str(exc))}")
            continue
        apps[uri] = PinnedApp(uri=uri, content_hash=digest, tools=tuple(sorted(names)))
    return apps, lines


def pinned_app_of(apps: Mapping[str, PinnedApp], tool: str) -> str | None:
    """The URI of the app pinned for `tool` (by its name on the server), or None."""
    for uri, app in apps.items():
        if tool in app.tools:
            return uri
    return None


async def check_apps(
    apps: Mapping[str, PinnedApp],
    named: Iterable[tuple[str, str]],
    connection: Connection,
    timeout: float,  # noqa: ASYNC109 - bounds each read
) -> tuple[dict[str, str], dict[str, str]]:
    """Hold each loaded tool's app (`named`: tool name on the server, app URI) to its pin.

    Returns the tools refused, with the reason (another app than the pinned one, an app
    whose contents changed or cannot be read), and the tools whose app was never pinned
    (offered without it), with the line saying so.  Each pinned app is read once."""
    refused: dict[str, str] = {}
    unpinned: dict[str, str] = {}
    users: dict[str, list[str]] = {}
    for tool, uri in named:
        pinned_uri = pinned_app_of(apps, tool)
        if pinned_uri is None:
            unpinned[tool] = (
                f"its app {sanitize(uri)} is not pinned, so no host is offered it; "
                "pin again to offer it"
            )
        elif pinned_uri != uri:
            refused[tool] = (
                f"its app changed since it was pinned (now {sanitize(uri)}, pinned "
                f"{sanitize(pinned_uri)}); review it and pin again"
            )
        else:
            users.setdefault(uri, []).append(tool)
    for uri, tools in users.items():
        try:
            digest = await read_app(connection, uri, timeout)
        except Exception as exc:
            reason = f"its app {sanitize(uri)} could not be read: {sanitize(str(exc))}"
        else:
            if digest == apps[uri].content_hash:
                continue
            reason = (
                f"its app {sanitize(uri)} changed since it was pinned (its contents' SHA-256 "
                "differs); review it and pin again"
            )
        for tool in tools:
            refused[tool] = reason
    return refused, unpinned
