"""The errors `agentrt.mcp` raises on purpose, each one sentence naming the thing.

Owned by the pin/load engineer (h1b); the connection layer's own errors live
in `_connection_errors.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import AgentrtError

if TYPE_CHECKING:
    from ._load import Report

__all__ = ["LoadError", "MCPError", "OperatorFileError", "PinError", "ServerToolError"]


class MCPError(AgentrtError):
    """Base class of the errors of `agentrt.mcp`."""


class PinError(MCPError):
    """Pinning a server failed: it could not be reached, listed, or answered too late."""


class LoadError(MCPError):
    """Loading a server's tools failed as a whole; `report` is set when the checks ran."""

    def __init__(self, message: str, report: Report | None = None) -> None:
        super().__init__(message)
        self.report = report


class OperatorFileError(MCPError):
    """A manifest or rules file is unsafe to trust or not in the expected format."""


class ServerToolError(MCPError):
    """A call to a server's tool failed; the runtime records it as a tool error.

    `outcome_known` is False when the call was cut off before the server
    answered (a timeout, a lost connection): it may or may not have taken
    effect, and a caller must not treat it as a plain failure.
    """

    def __init__(self, message: str, *, outcome_known: bool = True) -> None:
        super().__init__(message)
        self.outcome_known = outcome_known
