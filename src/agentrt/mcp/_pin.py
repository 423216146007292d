"""`pin`: record what a server's tools present, for an operator to review and store."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio

from ..sanitize import sanitize
from . import _connection
from ._errors import PinError
from ._manifest import Manifest, PinnedTool, pin_raw_tool
from ._server import Server
from ._steps import StepTracker

__all__ = ["pin"]


async def pin(server: Server) -> Manifest:
    """Connect, list the tools and pin each one's name, description, schema and annotations.

    Connecting, the handshake and the listing are bounded together by
    `server.connect_timeout`; on expiry the error names the step (and, for a
    stdio server, the tail of its stderr).  The connection is closed before
    this returns.
    """
    steps = StepTracker(server)
    connection: _connection.Connection | None = None
    try:
        with anyio.fail_after(server.connect_timeout):
            steps.enter("connecting")
            connection = await _connection.connect(
                server, on_step=steps.enter, on_started=steps.started
            )
            steps.enter("listing the tools")
            raw_tools = await connection.list_tools()
    except TimeoutError:
        raise PinError(steps.timed_out("pinning")) from None
    except Exception as exc:
        if isinstance(exc, PinError):
            raise
        raise PinError(
            f'pinning server "{sanitize(server.name)}" failed while {steps.current}: '
            f"{sanitize(str(exc))}"
        ) from exc
    finally:
        if connection is not None:
            with anyio.CancelScope(shield=True):
                await connection.aclose()
    tools: dict[str, PinnedTool] = {}
    for raw_tool in raw_tools:
        # A tool without a usable name cannot be classified, so it cannot be pinned either.
        if raw_tool.name is not None:
            tools[raw_tool.name] = pin_raw_tool(raw_tool.name, raw_tool.raw)
    return Manifest(server=server.name, pinned_at=datetime.now(UTC), tools=tools)
