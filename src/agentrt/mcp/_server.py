"""`Server`: how to reach one MCP server, and how much of this process it gets."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Final

from ..sanitize import sanitize
from ._sandbox import Sandbox

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_MAX_CONTENT_BYTES", "Server"]

DEFAULT_CONNECT_TIMEOUT: Final = 30.0
DEFAULT_MAX_CONTENT_BYTES: Final = 64 * 1024

_VARIABLE_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "$" allows a final newline


REVISION_MODES: Final = ("auto", "session", "legacy")


@dataclass(frozen=True, slots=True)
class Server:
    """One MCP server: a stdio `command` or a streamable HTTP `endpoint`, never both.

    A stdio server gets an exact environment: PATH, HOME and TMPDIR when set
    here, then the variables `inherit_env` names, then `env` (`NAME=value`).
    `stderr` receives the server's stderr (a binary file with a real
    descriptor); with None its last few KiB are kept for error messages.
    `http_client_factory` returns a new `httpx2.AsyncClient` for one HTTP
    connection, which uses it and closes it with the connection (never a
    shared client); it follows redirects only if that client says so.  Durations are float seconds.
    `sandbox`, for a stdio server, confines it with bubblewrap; a server with a
    sandbox is never started without one.  `client_capabilities` are what the
    handshake advertises (default none): set `sampling`, `elicitation` or `roots`
    only when a caller answers them (a `CallContext` with an `ask`); anything else is refused.
    `revision`: "auto" probes with `server/discover` and speaks the 2026-07-28 revision to a
    server that answers it, else the `initialize` handshake; "session" performs the
    handshake first and probes only when it is refused (a server that speaks both eras
    keeps a session: its pushes, subscriptions and mid-call requests ride it); "legacy"
    never probes.
    """

    name: str
    command: list[str] | None = None
    endpoint: str | None = None
    inherit_env: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    stderr: IO[bytes] | None = None
    http_client_factory: Callable[[], Any] | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    default_timeout: float | None = None
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES
    sandbox: Sandbox | None = None
    client_capabilities: Mapping[str, Any] | None = None
    # "session" (the default): initialize first, server/discover when it is refused;
    # "auto": server/discover first, initialize as the fallback; "legacy": initialize only.
    revision: str = "session"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a server needs a name")
        if (self.command is None) == (self.endpoint is None):
            raise ValueError(
                f'server "{sanitize(self.name)}" needs exactly one of command and endpoint'
            )
        if self.command is not None and (
            not self.command or not all(isinstance(part, str) for part in self.command)
        ):
            raise ValueError(
                f'server "{sanitize(self.name)}" has an empty command or a non-string argument'
            )
        for name in self.inherit_env:
            if not isinstance(name, str) or not _VARIABLE_NAME.match(name):
                raise ValueError(
                    f'server "{sanitize(self.name)}": inherit_env entry '
                    f"{sanitize(repr(name))} is not a variable name"
                )
        for entry in self.env:
            variable, equals, _ = entry.partition("=") if isinstance(entry, str) else ("", "", "")
            if not equals or not _VARIABLE_NAME.match(variable):
                raise ValueError(
                    f'server "{sanitize(self.name)}": env entry '
                    f"{sanitize(repr(entry))} is not NAME=value"
                )
        if self.sandbox is not None and not isinstance(self.sandbox, Sandbox):
            raise ValueError(f'server "{sanitize(self.name)}": sandbox must be a Sandbox')
        if self.sandbox is not None and self.command is None:
            raise ValueError(
                f'server "{sanitize(self.name)}" has a sandbox but no command; '
                "only a stdio server runs on this machine"
            )
        if not self.connect_timeout > 0:
            raise ValueError(f'server "{sanitize(self.name)}": connect_timeout must be positive')
        if self.default_timeout is not None and not self.default_timeout > 0:
            raise ValueError(f'server "{sanitize(self.name)}": default_timeout must be positive')
        if self.revision not in REVISION_MODES:
            raise ValueError(
                f'server "{sanitize(self.name)}": revision must be "auto", "session" or "legacy"'
            )
        if self.max_content_bytes < 64:
            raise ValueError(f'server "{sanitize(self.name)}": max_content_bytes is too small')
