"""The operator's rules, changed while the proxy serves, taken without a restart.

`agentrt classify` writes a server's rules where they live: the proxy's
configuration file, or the server's own rules file.  The proxy looks at both
once a second; when one changed, the whole configuration is read again with
`load_config` (the same ownership rules and checks as at start: a file others
may write, or one that does not check, is refused in one line and the proxy
keeps the rules it had).  What is taken is the rules: each server's rules,
its proxy-only rule fields, conditions, labels and resource rules, and the
class policy and flow rules; a change to anything else (a server added, a
command, the database) waits for the next start, and says so.

The new policy, with its identity, is swapped in only while no call is in the
gate, so a call is decided and recorded under one policy from its start to its
end; each server's listing is then held to its manifest under the new rules on
its running session (`take_manifest`, as a new manifest is), so a tool newly
classified is served and a renamed one only under its new name, and the hosts
are told when what they may see changed (decision 0047).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

import anyio
import anyio.to_thread

from ..errors import AgentrtError
from ..mcp import read_manifest
from ..mcp._load import take_manifest
from ..mcp._tool import ServerTool
from ..sanitize import sanitize
from ._log import log_line
from ._proxy import _servers_by_tool
from ._stamps import Stamp, rule_stamps, stamp
from .config import ConfigError, ProxyConfig, UpstreamConfig, load_config

if TYPE_CHECKING:
    from ..mcp import Manifest
    from ..mcp._connection import RawTool
    from ..mcp._upstream import Recheck, Upstream
    from ..tools import Tool
    from ._live import LiveListings
    from ._proxy import Proxy

__all__ = ["RULES_POLL", "RulesWatch"]

RULES_POLL: Final = 1.0
"""Seconds between two looks at the configuration and the rules files."""

_UNCLASSIFIED: Final = "no rule classifies it any more; classify it to serve it again"

_BETWEEN_CALLS: Final = 0.05
"""Seconds between two looks for a moment when no call is in the gate."""


def _rules_of(old: UpstreamConfig, new: UpstreamConfig) -> UpstreamConfig:
    """`old` with the rules of `new`: the rest of a server waits for the next start."""
    return dataclasses.replace(
        old,
        rules=new.rules,
        rules_path=new.rules_path,
        tool_rules=new.tool_rules,
        conditions=new.conditions,
        labels=new.labels,
        resource_rules=new.resource_rules,
    )


def _rest_differs(old: UpstreamConfig, new: UpstreamConfig) -> bool:
    return _rules_of(old, new) != new


class RulesWatch:
    """The configuration and rules files, whose rules are taken again when they change."""

    def __init__(
        self,
        proxy: Proxy,
        live: LiveListings,
        log: IO[str],
        stamps: dict[Path, Stamp] | None = None,
    ) -> None:
        """`stamps`: the files as they were when the configuration was read (`rule_stamps`)."""
        self.proxy = proxy
        self.live = live
        self.log = log
        self.stamps = dict(stamps) if stamps is not None else rule_stamps(proxy.config)
        # A change seen since the last take.
        self.pending = False
        # Each server's recheck as its manifest and the new rules made it, before the
        # tools no rule classifies are added to it at the swap.
        self._bases: dict[str, Recheck | None] = {}

    async def run(self) -> None:
        while True:
            await anyio.sleep(RULES_POLL)
            await self.look()

    async def look(self) -> bool:
        """Take the rules if a file changed since the last look; whether they were taken."""
        for path in list(self.stamps):
            now = stamp(path)
            if now != self.stamps[path]:
                self.stamps[path] = now
                self.pending = True
        if not self.pending:
            return False
        self.pending = False
        return await self.take()

    async def take(self) -> bool:
        """Read the configuration again and serve under its rules; whether taken."""
        proxy = self.proxy
        old = proxy.config
        shown = sanitize(str(old.path))
        try:
            new = await anyio.to_thread.run_sync(load_config, old.path)
        except (ConfigError, AgentrtError, OSError) as exc:
            log_line(self.log, f"agentrt proxy: the rules of {shown} changed, but were not "
                     f"taken: {sanitize(str(exc))}; the proxy keeps the ones it had")  # fmt: skip
            return False
        names = [up.server.name for up in old.servers]
        if [up.server.name for up in new.servers] != names:
            log_line(self.log, f"agentrt proxy: the servers of {shown} changed, so its rules "
                     "were not taken: servers are added or removed at the next start; the "
                     "proxy keeps the rules it had")  # fmt: skip
            return False
        servers = [_rules_of(was, now) for was, now in zip(old.servers, new.servers, strict=True)]
        config = dataclasses.replace(old, servers=servers, policy=new.policy, flows=new.flows)
        if any(_rest_differs(was, now) for was, now in zip(old.servers, new.servers, strict=True)):
            log_line(self.log, f"agentrt proxy: {shown} changed more than its rules: the rest "
                     "is taken at the next start")  # fmt: skip
        before = proxy.visible_tools()
        taken = [await self._held(upstream) for upstream in servers]
        # Between calls: no await from here to the last tool admitted, so a call is
        # decided and recorded under one policy and sees each tool under one class.
        # Polled, not `in_flight.wait()`: its one event is shutdown's, which must not be taken.
        while proxy.in_flight.count:  # noqa: ASYNC110
            await anyio.sleep(_BETWEEN_CALLS)
        self._swap_policy(config)
        for upstream, held in zip(servers, taken, strict=True):
            if held is not None:
                self._admit(upstream, *held)
        self.stamps.update(rule_stamps(config))
        log_line(self.log, f"agentrt proxy: took the new rules of {shown} (policy "
                 f"{sanitize(str(proxy.call_path().policy.id))})")  # fmt: skip
        if proxy.visible_tools() != before:
            await proxy.listeners.tools_changed()
        return True

    def _swap_policy(self, config: ProxyConfig) -> None:
        from ._calls import proxy_policy  # the call path's, built here if no call came yet

        proxy = self.proxy
        path = proxy.call_path()
        old = path.policy
        policy = proxy_policy(config, proxy.store)
        policy.resource_rules = old.resource_rules
        policy.reads_principals = old.reads_principals
        proxy.server_names = {**proxy.server_names, **_servers_by_tool(config)}
        if old.grants is not None:
            old.grants.servers = dict(proxy.server_names)
            policy.grants = old.grants
        proxy.config = config
        path.gate.policy = policy
        path.calls.policy = policy

    async def _held(self, upstream: UpstreamConfig) -> tuple[Manifest, list[Tool], str] | None:
        """A loaded server's listing held to its manifest under its new rules, on its
        running session: the manifest, the tools they register and the report; None when
        the server is not loaded (loaded under these rules later) or cannot be listed."""
        name = upstream.server.name
        session = self.proxy.upstreams.get(name)
        if session is None:
            return None
        try:
            manifest = await anyio.to_thread.run_sync(read_manifest, upstream.manifest_path)
            # Withheld since a rule was removed: still withheld until the swap decides.
            carried = {tool: why for tool, why in session.refused.items() if why == _UNCLASSIFIED}
            tools, report = await take_manifest(upstream.server, manifest, upstream.rules, session)
            self._bases[name] = session.recheck
            _refuse(session, self._bases[name], carried)
        except (AgentrtError, OSError, ValueError) as exc:
            log_line(self.log, f"agentrt proxy: server {sanitize(name)}: its new rules were "
                     f"not applied to its tools: {sanitize(str(exc))}")  # fmt: skip
            return None
        return manifest, tools, str(report)

    def _admit(
        self, upstream: UpstreamConfig, manifest: Manifest, tools: list[Tool], report: str
    ) -> None:
        """Serve the tools the new rules register in place of their old selves, and
        withhold those no rule classifies any more."""
        self._withhold_unclassified(upstream, tools)
        lines = [
            *report.splitlines(),
            *self.proxy.admit([(tool, upstream) for tool in tools], replacing=True),
            *self._retire_renamed(upstream, tools),
        ]
        for line in lines:
            log_line(self.log, f"agentrt proxy: {line}")
        watch = self.live.watches.get(upstream.server.name)
        if watch is not None:
            watch.manifest = manifest

    def _retire_renamed(self, upstream: UpstreamConfig, tools: list[Tool]) -> list[str]:
        """Stop serving each old name of a tool of `upstream` its new rule renamed, as if
        it never was (`Proxy.retire`); the lines to log.  Retired even when the new name
        was refused: a tool is served only as the rules in force name it."""
        server = upstream.server.name
        renamed = {
            tool.server_tool_name: tool.spec.name for tool in tools if isinstance(tool, ServerTool)
        }
        lines = []
        for old, tool in list(self.proxy.server_tools.items()):
            new = renamed.get(tool.server_tool_name)
            if self.proxy.server_of[old].server.name != server or new in (None, old):
                continue
            self.proxy.retire(old)
            lines.append(f"server {sanitize(server)}: its rules rename "
                         f"{sanitize(tool.server_tool_name)} to {sanitize(new)}; {sanitize(old)} "
                         "is no longer served")  # fmt: skip
        return lines

    def _withhold_unclassified(self, upstream: UpstreamConfig, tools: list[Tool]) -> None:
        """A served tool of `upstream` whose rule is gone is refused on its session, as a
        tool whose pin it no longer matches is: withheld from the host, its call answered
        "nothing ran"; through relistings too, until a rule classifies it again."""
        name = upstream.server.name
        kept = {tool.server_tool_name for tool in tools if isinstance(tool, ServerTool)}
        gone = {
            tool.server_tool_name: _UNCLASSIFIED
            for final, tool in self.proxy.server_tools.items()
            if self.proxy.server_of[final].server.name == name and tool.server_tool_name not in kept
        }
        _refuse(self.proxy.upstreams[name], self._bases.pop(name, None), gone)


def _refuse(session: Upstream, base: Recheck | None, gone: dict[str, str]) -> None:
    """`session`'s refusals and later rechecks: `base`'s, and each tool of `gone`; the
    tools no rule classified before and one does now are no longer withheld for it."""
    others = {tool: why for tool, why in session.refused.items() if why != _UNCLASSIFIED}
    session.adopt({**others, **gone}, "its rules changed" if gone else session.refused_since)
    if not gone:
        session.recheck = base
        return

    def recheck(raw_tools: list[RawTool]) -> dict[str, str]:
        return {**(base(raw_tools) if base is not None else {}), **gone}

    session.recheck = recheck
