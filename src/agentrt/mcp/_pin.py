"""`pin`: record what a server's tools present, for an operator to review and store."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio

from ._errors import PinError
from ._manifest import Manifest, PinnedTool, pin_raw_tool
from ._phase import Phase
from ._server import Server

__all__ = ["pin"]


async def pin(server: Server) -> Manifest:
    """Connect, list the tools and pin each one's name, description, schema and annotations.

    Connecting, the handshake and the listing are bounded together by
    `server.connect_timeout`; on expiry the error names the step (and, for a
    stdio server, the tail of its stderr).  The connection is closed before
    this returns.
    """
    phase = Phase(server, "pinning")
    try:
        with anyio.fail_after(server.connect_timeout):
            raw_tools = await phase.connect_and_list()
    except Exception as exc:
        raise PinError(phase.failure(exc)) from exc
    finally:
        await phase.close()
    tools: dict[str, PinnedTool] = {}
    for raw_tool in raw_tools:
        # A tool without a usable name cannot be classified, so it cannot be pinned either.
        if raw_tool.name is not None:
            tools[raw_tool.name] = pin_raw_tool(raw_tool.name, raw_tool.raw)
    return Manifest(server=server.name, pinned_at=datetime.now(UTC), tools=tools)
