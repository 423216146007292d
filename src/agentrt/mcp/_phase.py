"""The bounded phase pin and load share: connect, list the tools, and say where it stopped."""

from __future__ import annotations

import anyio

from ..sanitize import sanitize
from . import _connection
from ._server import Server

__all__ = ["Phase"]


class Phase:
    """One pin or load of one server, run by the caller under `server.connect_timeout`.

    It remembers the step in progress and the connection as soon as it
    exists, so an error can name the step and, for a stdio server, quote the
    tail of its stderr even when the deadline fired mid-handshake.
    """

    def __init__(self, server: Server, action: str) -> None:
        self._server = server
        self._action = action
        self.step = "starting"
        self.connection: _connection.Connection | None = None

    def enter(self, step: str) -> None:
        self.step = step

    def _started(self, connection: _connection.Connection) -> None:
        self.connection = connection

    async def connect_and_list(self) -> list[_connection.RawTool]:
        """Connect, perform the handshake and list every tool the server offers."""
        self.enter("connecting")
        self.connection = await _connection.connect(
            self._server, on_step=self.enter, on_started=self._started
        )
        self.enter("listing the tools")
        return await self.connection.list_tools()

    async def close(self) -> None:
        """Close the connection if one was made; safe while being cancelled."""
        if self.connection is not None:
            with anyio.CancelScope(shield=True):
                await self.connection.aclose()

    def failure(self, error: Exception) -> str:
        """One sentence for `error`: the deadline and the step, or the step and the cause."""
        name = sanitize(self._server.name)
        if isinstance(error, TimeoutError) and not isinstance(
            error, _connection.MCPConnectionError
        ):
            message = (
                f'{self._action} server "{name}" timed out after '
                f"{self._server.connect_timeout:g}s while {sanitize(self.step)}"
            )
            tail = self.connection.stderr_tail() if self.connection is not None else ""
            if tail:
                message += f"; its stderr ends with: {sanitize(tail)}"
            return message
        return (
            f'{self._action} server "{name}" failed while {sanitize(self.step)}: '
            f"{sanitize(str(error))}"
        )
