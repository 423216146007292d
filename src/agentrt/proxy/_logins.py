"""Which proxied tools belong to a remote server reached with OAuth tokens, the check each
call to one makes before it enters the gate, and the servers that wait for a login while
the proxy serves (`LoginWatch`; docs/oauth.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

import anyio

from ..errors import AgentrtError
from ..mcp import load, read_manifest
from ..mcp._tool import ServerTool
from ..sanitize import sanitize
from ._log import log_line

if TYPE_CHECKING:
    from ..mcp import Connection
    from ..mcp._oauth import OAuthSession
    from ..tools import Tool
    from ._live import LiveListings
    from ._proxy import Proxy
    from .config import UpstreamConfig

__all__ = ["LOGIN_POLL", "LoginWatch", "oauth_preflights"]


def oauth_preflights(
    tools: Sequence[tuple[Tool, UpstreamConfig]],
) -> dict[str, Callable[[], Awaitable[str | None]]]:
    """Each tool of an OAuth server by name: a check that says why its server waits for
    `agentrt login`, or None when its tokens serve (refreshed first when near their end)."""
    checks: dict[str, Callable[[], Awaitable[str | None]]] = {}
    for tool, upstream in tools:
        factory = upstream.server.http_client_factory
        if factory is None:
            continue  # no HTTP client of its own: the OAuth module (and httpx2) stays unloaded
        from ..mcp._oauth import OAuthClientFactory

        if isinstance(factory, OAuthClientFactory):
            checks[tool.spec.name] = factory.session.preflight
    return checks


LOGIN_POLL: Final = 1.0
"""Seconds between two looks at the token and manifest files of a server waiting for a login."""


def _stamp(path: Path) -> tuple[int, int] | None:
    """What says a file changed: its modification time and size (None when absent)."""
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size)


@dataclass
class _Waiting:
    upstream: UpstreamConfig
    session: OAuthSession
    # The token and manifest files' stamps at the last attempt: tried again only on a change.
    seen: tuple[tuple[int, int] | None, tuple[int, int] | None] | None = None


class LoginWatch:
    """Servers that waited for `agentrt login` when the proxy started: once a login writes
    their tokens (and a manifest pins them), each is loaded, held to its pins exactly as at
    start under the rules in force then, and served; the hosts that listed the tools are
    told their list changed."""

    def __init__(
        self,
        proxy: Proxy,
        waiting: Sequence[UpstreamConfig],
        live: LiveListings,
        connections: list[Connection],
        log: IO[str],
    ) -> None:
        self.proxy = proxy
        self.live = live
        self.connections = connections
        self.log = log
        self.waiting: dict[str, _Waiting] = {}
        for upstream in waiting:
            factory = upstream.server.http_client_factory
            if factory is None:
                continue  # no HTTP client of its own: the OAuth module (and httpx2) stays unloaded
            from ..mcp._oauth import OAuthClientFactory

            if isinstance(factory, OAuthClientFactory):
                self.waiting[upstream.server.name] = _Waiting(upstream, factory.session)

    async def run(self) -> None:
        """Look every `LOGIN_POLL` seconds until every waiting server is served."""
        while self.waiting:
            await anyio.sleep(LOGIN_POLL)
            for name in list(self.waiting):
                await self.attempt(name)

    async def attempt(self, name: str) -> bool:
        """Load server `name` if its login (or its manifest) changed since the last attempt
        and its tokens serve now; whether it is served."""
        waiting = self.waiting[name]
        upstream = self._in_force(waiting.upstream)
        stamps = (_stamp(waiting.session.file.path), _stamp(upstream.manifest_path))
        if stamps == waiting.seen:
            return False
        waiting.seen = stamps
        if await waiting.session.waiting_for_login() is not None:
            return False
        shown = sanitize(name)
        if not upstream.manifest_path.exists():
            log_line(self.log, f"agentrt proxy: server {shown} is logged in now; pin it "
                     f"(agentrt pin --config FILE {shown}) to serve it")  # fmt: skip
            return False
        try:
            manifest = read_manifest(upstream.manifest_path)
            tools, report = await load(upstream.server, manifest, upstream.rules)
        except (AgentrtError, OSError, ValueError) as exc:
            log_line(self.log, f"agentrt proxy: server {shown} is logged in now, but did not "
                     f"load: {sanitize(str(exc))}")  # fmt: skip
            return False
        del self.waiting[name]
        if report.connection is not None:
            self.connections.append(report.connection)
        lines = [*str(report).splitlines(), *self.proxy.admit([(t, upstream) for t in tools])]
        for line in lines:
            log_line(self.log, f"agentrt proxy: {line}")
        log_line(self.log, f"agentrt proxy: server {shown} is logged in now and served")
        served = [tool for tool in tools if isinstance(tool, ServerTool)]
        if served:
            self.live.watch(name, served[0].upstream, manifest)
        await self.proxy.listeners.tools_changed()
        return True

    def _in_force(self, upstream: UpstreamConfig) -> UpstreamConfig:
        """The server's entry under the rules in force: the proxy's configuration, whose
        rules a change while the proxy serves replaced (`_rules_reload.py`), not the
        start's."""
        name = upstream.server.name
        return next((up for up in self.proxy.config.servers if up.server.name == name), upstream)
