"""Which step of a pin or load is running, so a timeout can say where it stopped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..sanitize import sanitize
from ._server import Server

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["StepTracker"]


class StepTracker:
    """Remembers the current step; `timed_out` words the error for an expired deadline."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self.current = "starting"
        self._connection: Connection | None = None

    def enter(self, step: str) -> None:
        self.current = step

    def started(self, connection: Connection) -> None:
        """Keep the connection as soon as it exists, so a timeout mid-handshake has its stderr."""
        self._connection = connection

    def timed_out(self, action: str) -> str:
        message = (
            f'{action} server "{sanitize(self._server.name)}" timed out after '
            f"{self._server.connect_timeout:g}s while {sanitize(self.current)}"
        )
        tail = self._connection.stderr_tail() if self._connection is not None else ""
        if tail:
            message += f"; its stderr ends with: {sanitize(tail)}"
        return message
