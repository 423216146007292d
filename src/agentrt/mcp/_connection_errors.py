"""The errors a connection to an MCP server raises, each one sentence naming the server.

Text the server chose (an error message, a line of its stderr) is escaped
with `sanitize` before it becomes part of a message.
"""

from __future__ import annotations

from typing import Any

from ..errors import AgentrtError
from ..sanitize import sanitize

__all__ = [
    "CallTimeout",
    "ConnectionClosed",
    "HeaderMismatchRefused",
    "MCPConnectionError",
    "MessageTooLong",
    "NotSent",
    "ProtocolViolation",
    "RefusedRedirect",
    "ServerErrorResponse",
]


class MCPConnectionError(AgentrtError):
    """A connection to an MCP server could not be made or used.

    `server` is the server's configured name.  The message is one sentence,
    with server text escaped and, for a stdio server whose stderr is kept,
    the tail of that stderr appended.
    """

    def __init__(self, server: str, message: str) -> None:
        self.server = server
        super().__init__(message)


class ConnectionClosed(MCPConnectionError):
    """The connection is closed: `aclose()` ran, or the server went away."""


class NotSent(ConnectionClosed):
    """A request was never written to the server, so nothing it asked for ran.

    Raised when the connection was already broken or closed before the
    first byte went out, or the first write failed: a known outcome, unlike
    a request cut off after it was sent.
    """


class ProtocolViolation(MCPConnectionError):
    """The server sent something the protocol or this client's bounds refuse."""


class MessageTooLong(ProtocolViolation):
    """The server answered with a message longer than the line bound; it was discarded unread.

    The request ran (the server answered it), but what it answered is
    unknown: a success or an error.  The connection stays usable.
    """


class ServerErrorResponse(MCPConnectionError):
    """The server answered a request with a JSON-RPC error.

    `code` is the error code; `server_message` is the server's own message,
    already escaped; `data` is the error's `data` member as parsed, or None.
    """

    def __init__(self, server: str, method: str, error: dict[str, Any]) -> None:
        self.code: int = error["code"]
        self.server_message = sanitize(str(error["message"]))
        self.data: Any = error.get("data")
        # The HTTP error status that carried it (None on stdio or in a 200 body).
        self.http_status: int | None = None
        super().__init__(
            server,
            f'server "{sanitize(server)}" answered {method} with error {self.code}: '
            f"{self.server_message}",
        )


class HeaderMismatchRefused(ServerErrorResponse):
    """A call the server refused before running it, for headers that disagree with its
    body (`HeaderMismatchError`, -32020), and that one retry after listing the tools again
    did not mend.  Nothing ran.  One sentence."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(server, "tools/call", {"code": -32020, "message": message})
        self.args = (message,)


class CallTimeout(MCPConnectionError, TimeoutError):
    """A request got no answer within its timeout; a cancellation was sent for it."""


class RefusedRedirect(ProtocolViolation):
    """The server answered with a redirect, which is not followed (`_http.py`; here so the
    connection can name it without importing the HTTP client)."""
