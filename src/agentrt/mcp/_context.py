"""`CallContext`: the per-call channels of one tool call, handed down explicitly.

A caller that relays a server to a host (the proxy) wants, for each call, the
server's progress, its log lines and its own requests (sampling, elicitation,
roots) passed on, and the run the gate opened for the call named.  These
travel in one object, as the MCP SDK's dispatcher hands each handler its
context: the caller builds it, `Gate.step` carries it opaquely on the
`ToolCall`, `ServerTool` hands it to the `Connection`, and the connection
gives each message to the context of the request whose read (stdio) or stream
(HTTP) delivered it.  No layer in between reads anything it was not given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Ask", "AskRefused", "CallContext", "LogListener", "Progress"]

Progress = Callable[[float, float | None, str | None], Awaitable[None]]
"""Called with `progress`, `total` and `message` for each `notifications/progress` of a call."""

LogListener = Callable[[str, str | None, Any], Awaitable[None]]
"""Called with `level`, `logger` and `data` (as parsed) for a server's `notifications/message`."""

Ask = Callable[[str, Any], Awaitable[Any]]
"""Answers a server's request (`method`, `params` as parsed) with its result, or raises
`AskRefused`."""


class AskRefused(Exception):
    """A server's request is refused: `code` and the one-sentence `message` go back to it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class CallContext:
    """The channels of one tool call; each is optional, and None drops what it would carry.

    `progress` receives the server's progress for the call (the request then
    carries a `progressToken`).  `log` receives the server's log lines read
    while the call's requests are in flight.  `ask` answers the server's
    sampling, elicitation or roots requests made during the call (the `Server`
    must advertise the capability in `client_capabilities`), and the
    input-required rounds of the 2026-07-28 revision.  `on_run` is told the run
    id of each execution of a tool carrying this context, before the tool runs
    (the proxy records a server's requests in that run).
    """

    progress: Progress | None = None
    log: LogListener | None = None
    ask: Ask | None = None
    on_run: Callable[[str], None] | None = None
    trace: Mapping[str, str] | None = None
    """W3C trace context (`traceparent`, `tracestate`) the call's requests carry in their
    `_meta`, so the server's spans join the caller's trace."""
