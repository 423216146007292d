"""`pin`: record what a server's tools present, for an operator to review and store."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import anyio

from ._apps import pin_apps
from ._connection import Connection, ProtocolViolation, ServerErrorResponse
from ._errors import PinError
from ._manifest import Manifest, PinnedOffer, PinnedTool, pin_offer, pin_raw_tool
from ._phase import Phase
from ._server import Server

__all__ = ["pin"]


async def pin(server: Server) -> Manifest:
    """Connect, list the tools and pin each one's name, description, schema and annotations;
    and, when the server offers them, its prompts, resources and resource templates.

    Connecting, the handshake and the listing are bounded together by
    `server.connect_timeout`; on expiry the error names the step (and, for a
    stdio server, the tail of its stderr).  The connection is closed before
    this returns.
    """
    phase = Phase(server, "pinning")
    try:
        with anyio.fail_after(server.connect_timeout):
            raw_tools = await phase.connect_and_list()
            assert phase.connection is not None
            phase.enter("listing the prompts and resources")
            offers = await _list_offers(phase.connection, server.connect_timeout)
            phase.enter("reading the tools' apps")
            named = [(raw.name, raw.raw) for raw in raw_tools if raw.name is not None]
            # An app that cannot be read stays unpinned; `load` says its tools go without it.
            apps, _unread = await pin_apps(
                phase.connection, named, offers.get("resources") or {}, server.connect_timeout
            )
            revision = phase.connection.protocol_version
    except Exception as exc:
        raise PinError(phase.failure(exc)) from exc
    finally:
        await phase.close()
    tools: dict[str, PinnedTool] = {}
    for raw_tool in raw_tools:
        # A tool without a usable name cannot be classified, so it cannot be pinned either.
        if raw_tool.name is not None:
            tools[raw_tool.name] = pin_raw_tool(raw_tool.name, raw_tool.raw)
    return Manifest(
        server=server.name,
        pinned_at=datetime.now(UTC),
        tools=tools,
        **offers,
        apps=apps or None,
        revision=revision,
    )


LISTINGS: dict[str, tuple[str, str, str]] = {
    # section: (capability, method, result key)
    "prompts": ("prompts", "prompts/list", "prompts"),
    "resources": ("resources", "resources/list", "resources"),
    "resource_templates": ("resources", "resources/templates/list", "resourceTemplates"),
}


async def _list_offers(connection: Connection, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
    """Each section the server's capabilities announce, pinned; an unannounced one is an
    empty pin (the server offers none), so the manifest says it was looked at; one whose
    listing the server refuses is left out (not pinned)."""
    capabilities = connection.capabilities if isinstance(connection.capabilities, dict) else {}
    offers: dict[str, dict[str, PinnedOffer]] = {}
    for section, (capability, method, key) in LISTINGS.items():
        pins: dict[str, PinnedOffer] = {}
        if capability in capabilities:
            try:
                listed = await connection.list_all(method, key, timeout=timeout)
            except (ServerErrorResponse, ProtocolViolation):
                # A server that announces a section it cannot list still pins its tools;
                # the section stays unpinned, so nothing of it is offered (load says so).
                continue
            for raw in listed:
                pinned = pin_offer(section, raw) if isinstance(raw, dict) else None
                if pinned is not None:
                    pins[pinned.key] = pinned
        offers[section] = pins
    return offers
