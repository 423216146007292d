"""Live list changes: a server's `notifications/*/list_changed`, held to the pins.

When a loaded server says its tools changed, the proxy lists them again and
holds each loaded tool to its pin exactly as `load` did (`Upstream.relist`):
an unchanged tool stays, a changed one is refused (withheld from the host's
listing, its calls answered "nothing ran") and a tool nothing pinned stays
unserved.  Each change of what is refused or unpinned is one stderr line and
one `listing_changed` event in the chain (run id `server:<name>`); the hosts
that listed the tools are told `tools/list_changed` only when what they may
see changed.  A server's prompts or resources `list_changed` lists those
again and holds them to their pins as `load_offers` did at start: what now
fails is no longer offered (one stderr line), and the hosts are told
`prompts/list_changed` or `resources/list_changed` when their list changed.

Bounded: the notification only marks the server as wanting a listing; one
worker per server lists, so at most one listing is in flight per server, and
it waits `RELIST_INTERVAL` after each, so a storm of notifications costs one
listing a second while it lasts, and one after it.  The notification is read
when it is sent, also while no request to the server is open: each server's
`Upstream.watch_idle` reads its stdout between requests, or holds the standalone
GET stream of a legacy HTTP session whose server advertises list changes or
subscriptions (docs/decisions/0049).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Final, Literal

import anyio
from anyio.abc import TaskGroup

from ..canonical import canonical_json
from ..mcp import Manifest
from ..mcp._offers import load_offers
from ..mcp._upstream import Upstream
from ..sanitize import sanitize
from ._log import log_line
from ._offers import Offered
from ._upstreams import take_offers

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server as LowLevelServer
    from mcp.server.models import InitializationOptions

    from ._proxy import Proxy

__all__ = ["HostListeners", "LiveListings", "initialization_options"]

TOOLS_CHANGED: Final = "notifications/tools/list_changed"
# A server's prompts or resources: listed again together, as at load (`load_offers`).
OFFERS_CHANGED: Final = frozenset(
    {"notifications/prompts/list_changed", "notifications/resources/list_changed"}
)
RELIST_INTERVAL: Final = 1.0
"""Seconds between two listings of one server, however many notifications it sends."""

Notified = Callable[[str, dict[str, Any]], Awaitable[None]]


def initialization_options(server: LowLevelServer[Any]) -> InitializationOptions:
    """The proxy's capabilities, saying that its tool list may change while it serves."""
    from mcp.server.lowlevel import NotificationOptions

    return server.create_initialization_options(
        NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True)
    )


class HostListeners:
    """The host sessions that listed the proxy's tools, prompts or resources, to be told
    when a list changed: by the host's MCP session id over HTTP ("stdio" for the one stdio
    host), its latest session object.  A stateless host keeps no session and is told
    nothing."""

    def __init__(self) -> None:
        self._sessions: dict[str, Any] = {}
        # The 2026-07-28 hosts' `subscriptions/listen` streams (`_listen.HostEvents`), told too.
        self.streams: (
            Callable[[Literal["tools", "prompts", "resources"]], Awaitable[None]] | None
        ) = None

    def listened(self, key: str, session: Any) -> None:
        self._sessions[key] = session

    async def tools_changed(self) -> int:
        """Tell every listening host; a host that went away is forgotten.  How many were told."""
        return await self._tell("send_tool_list_changed", "tools")

    async def prompts_changed(self) -> int:
        return await self._tell("send_prompt_list_changed", "prompts")

    async def resources_changed(self) -> int:
        return await self._tell("send_resource_list_changed", "resources")

    async def _tell(self, method: str, kind: Literal["tools", "prompts", "resources"]) -> int:
        told = 0
        if self.streams is not None:
            await self.streams(kind)
        for key, session in list(self._sessions.items()):
            try:
                await getattr(session, method)()
                told += 1
            except Exception:
                self._sessions.pop(key, None)
        return told


@dataclass
class _Watch:
    """One server's wish to be listed again, and what its last listing found."""

    upstream: Upstream
    manifest: Manifest
    wanted: anyio.Event = field(default_factory=anyio.Event)
    offers_wanted: anyio.Event = field(default_factory=anyio.Event)
    offer_lines: frozenset[str] = frozenset()
    refused: dict[str, str] = field(default_factory=dict)
    unpinned: tuple[str, ...] = ()
    # Counted for the tests and the operator: notifications taken, listings made.
    notified: int = 0
    listings: int = 0


class LiveListings:
    """Each loaded server's list_changed, turned into at most one listing in flight."""

    def __init__(self, proxy: Proxy, manifests: Mapping[str, Manifest], log: IO[str]) -> None:
        self.proxy = proxy
        self.log = log
        self.watches: dict[str, _Watch] = {
            name: _Watch(upstream, manifests[name])
            for name, upstream in proxy.upstreams.items()
            if name in manifests
        }
        self._group: TaskGroup | None = None

    def install(self) -> None:
        """Take each server's list_changed; its other notifications go where they went."""
        for name in self.watches:
            self._install(name)

    def _install(self, name: str) -> None:
        connection = self.watches[name].upstream.connection
        connection.on_notification = functools.partial(
            self._notified, name, connection.on_notification
        )

    def watch(self, name: str, upstream: Upstream, manifest: Manifest) -> None:
        """Watch a server loaded while the proxy serves (its login came later)."""
        self.watches[name] = _Watch(upstream, manifest)
        self._install(name)
        if self._group is not None:
            self._group.start_soon(self._listen, name)  # 2026-07-28: its listen stream
            self._group.start_soon(self._work, name)
            self._group.start_soon(upstream.watch_idle)

    async def _notified(
        self, name: str, then: Notified | None, method: str, params: dict[str, Any]
    ) -> None:
        if method == TOOLS_CHANGED:
            # Only marked here: this runs inside the reader of another request, which must
            # not wait for a listing that reads from the same server.
            watch = self.watches[name]
            watch.notified += 1
            watch.wanted.set()
            return
        if method in OFFERS_CHANGED and name in self.proxy.offered.tools:
            # Only a server whose prompts or resources are served has gate tools for them.
            self.watches[name].offers_wanted.set()
            return
        if then is not None:
            await then(method, params)

    async def run(self) -> None:
        """One worker per server until cancelled (the proxy's shutdown)."""
        async with anyio.create_task_group() as group:
            self._group = group
            for name, watch in self.watches.items():
                # What the server sends between requests is read at once (decision 0049).
                group.start_soon(watch.upstream.watch_idle)
                group.start_soon(self._work, name)
                if name in self.proxy.offered.tools:
                    group.start_soon(self._work_offers, name)
            for name in self.watches:
                group.start_soon(self._listen, name)  # 2026-07-28: its listen stream

    async def _work(self, name: str) -> None:
        watch = self.watches[name]
        while True:
            await watch.wanted.wait()
            # Cleared before listing: a notification during the listing asks for one more.
            watch.wanted = anyio.Event()
            await self.relist(name)
            # At most one listing a second: a storm costs a listing a second while it lasts.
            await anyio.sleep(RELIST_INTERVAL)

    async def _listen(self, name: str) -> None:
        """A server on the 2026-07-28 revision tells of changes only on a listen stream
        (`mcp/_subscriptions.py`): held open while the proxy serves, its events taken here."""
        await self.watches[name].upstream.connection.listen.run(
            lambda sentence: log_line(self.log, f"agentrt proxy: {sentence}")
        )

    async def _work_offers(self, name: str) -> None:
        watch = self.watches[name]
        while True:
            await watch.offers_wanted.wait()
            watch.offers_wanted = anyio.Event()
            await self.relist_offers(name)
            await anyio.sleep(RELIST_INTERVAL)

    async def relist_offers(self, name: str) -> None:
        """List server `name`'s prompts, resources and templates again and hold each to its
        pin as at load: what now fails is no longer offered, what matches again is; the
        hosts are told which list they may see changed."""
        watch = self.watches[name]
        offered = self.proxy.offered
        upstream = next(up for up in self.proxy.config.servers if up.server.name == name)
        before = _offer_view(offered)
        try:
            offers = await load_offers(
                watch.upstream.connection, watch.manifest,
                prompts=upstream.prompts, timeout=upstream.server.connect_timeout,
            )  # fmt: skip
        except Exception as exc:
            log_line(self.log, f"agentrt proxy: server {sanitize(name)} said its prompts or "
                     f"resources changed, but listing them again failed: "
                     f"{sanitize(str(exc))}")  # fmt: skip
            return
        offered.prompts = {key: entry for key, entry in offered.prompts.items() if entry[1] != name}
        offered.resources = [entry for entry in offered.resources if entry[1] != name]
        offered.templates = [entry for entry in offered.templates if entry[1] != name]
        lines = frozenset(take_offers(offered, name, offers))
        for line in sorted(lines - watch.offer_lines):
            log_line(self.log, f"agentrt proxy: server {sanitize(name)} listed its prompts and "
                     f"resources again: {line}")  # fmt: skip
        watch.offer_lines = lines
        after = _offer_view(offered)
        if after[0] != before[0]:
            await self.proxy.listeners.prompts_changed()
        if after[1:] != before[1:]:
            await self.proxy.listeners.resources_changed()

    async def relist(self, name: str) -> None:
        """List server `name` again, record what changed and tell the hosts if they see a
        different list now.  A listing that fails keeps what was served and says so."""
        watch = self.watches[name]
        shown = sanitize(name)
        before = self.proxy.visible_tools()
        watch.listings += 1
        try:
            listing = await watch.upstream.relist()
        except Exception as exc:
            log_line(self.log, f"agentrt proxy: server {shown} said its tools changed, but "
                     f"listing them again failed: {sanitize(str(exc))}")  # fmt: skip
            return
        if listing is None:
            return  # the server is down: its next call starts it again and lists then
        refused = watch.upstream.refused
        listed = {raw.name for raw in listing if raw.name is not None}
        unpinned = tuple(sorted(listed - set(watch.manifest.tools)))
        if refused != watch.refused or unpinned != watch.unpinned:
            self._report(name, watch, refused, unpinned)
            watch.refused, watch.unpinned = refused, unpinned
            await self._record(name, refused, unpinned)
        if self.proxy.visible_tools() != before:
            await self.proxy.listeners.tools_changed()

    def _report(
        self, name: str, watch: _Watch, refused: dict[str, str], unpinned: tuple[str, ...]
    ) -> None:
        shown = sanitize(name)
        for tool, reason in sorted(refused.items()):
            if watch.refused.get(tool) != reason:
                log_line(self.log, f"agentrt proxy: server {shown} listed its tools again: "
                         f"refused {sanitize(tool)}: {sanitize(reason)}")  # fmt: skip
        for tool in sorted(set(watch.refused) - set(refused)):
            log_line(self.log, f"agentrt proxy: server {shown} listed its tools again: "
                     f"{sanitize(tool)} matches its pin again and is served")  # fmt: skip
        for tool in unpinned:
            if tool not in watch.unpinned:
                log_line(self.log, f"agentrt proxy: server {shown} listed its tools again: "
                         f"{sanitize(tool)} is not pinned, so it is not served; review it "
                         "with agentrt pin --config FILE")  # fmt: skip

    async def _record(self, name: str, refused: dict[str, str], unpinned: tuple[str, ...]) -> None:
        # Here, not at the top: the ledger is the call path's, imported at the first call
        # (decision 0066), and a listing changes rarely.
        from ..store import ledger

        store = self.proxy.store
        try:
            await store.write(
                functools.partial(ledger.record_listing_change, store),
                name, self.proxy.config.session, refused, unpinned,
            )  # fmt: skip
        except Exception as exc:
            log_line(self.log, f"agentrt proxy: the listing change of server {sanitize(name)} "
                     f"could not be recorded: {sanitize(str(exc))}")  # fmt: skip


def _offer_view(offered: Offered) -> tuple[str, str, str]:
    """What a host's prompts, resources and templates listings show, comparable."""
    return (
        canonical_json(sorted(offered.prompts)),
        canonical_json(sorted(canonical_json(raw) for raw, _ in offered.resources)),
        canonical_json(sorted(canonical_json(raw) for raw, _ in offered.templates)),
    )
