"""A loaded server's manifest, pinned again while the proxy serves, taken without a restart.

The operator reviews a tool the proxy refused (its server changed it) with
`agentrt pin --config FILE NAME`, which rewrites the server's manifest.  The
proxy looks at each loaded server's manifest file once a second; when it
changed, it is read again under the same ownership rules as at start
(`read_manifest`: a file others may write is refused, and the proxy keeps
the manifest it had), the server's current listing is held to it on its
running session exactly as a start would (`take_manifest`), the tools it
registers replace their old selves in the gate (calls in flight finish with
the ones they began with), and the hosts are told if their list changed.
A changed classification or rule is taken the same way by `_rules_reload.py`
(decision 0047).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

import anyio
import anyio.to_thread

from ..errors import AgentrtError
from ..mcp import read_manifest
from ..mcp._load import take_manifest
from ..sanitize import sanitize
from ._log import log_line

if TYPE_CHECKING:
    from ._live import LiveListings
    from ._proxy import Proxy

__all__ = ["MANIFEST_POLL", "ManifestWatch"]

MANIFEST_POLL: Final = 1.0
"""Seconds between two looks at the loaded servers' manifest files."""

_Stamp = tuple[int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    """What says a file changed: its modification time, size and mode (a chmod too)."""
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size, info.st_mode)


class ManifestWatch:
    """Each loaded server's manifest file, taken again when it changes."""

    def __init__(self, proxy: Proxy, live: LiveListings, log: IO[str]) -> None:
        self.proxy = proxy
        self.live = live
        self.log = log
        self.stamps: dict[str, _Stamp] = {}
        self._note_new_servers()

    def _note_new_servers(self) -> None:
        # A server loaded later (its login came) is watched from then on.
        for upstream in self.proxy.config.servers:
            name = upstream.server.name
            if name in self.proxy.upstreams and name not in self.stamps:
                self.stamps[name] = _stamp(upstream.manifest_path)

    async def run(self) -> None:
        while True:
            await anyio.sleep(MANIFEST_POLL)
            await self.look()

    async def look(self) -> None:
        """Take every manifest that changed since the last look."""
        self._note_new_servers()
        for upstream in self.proxy.config.servers:
            name = upstream.server.name
            if name not in self.stamps:
                continue
            stamp = _stamp(upstream.manifest_path)
            if stamp != self.stamps[name]:
                self.stamps[name] = stamp
                await self.take(name)

    async def take(self, name: str) -> bool:
        """Read server `name`'s manifest again and serve what it registers; whether taken."""
        upstream = next(up for up in self.proxy.config.servers if up.server.name == name)
        session = self.proxy.upstreams[name]
        shown = sanitize(name)
        before = self.proxy.visible_tools()
        try:
            manifest = await anyio.to_thread.run_sync(read_manifest, upstream.manifest_path)
            tools, report = await take_manifest(upstream.server, manifest, upstream.rules, session)
        except (AgentrtError, OSError, ValueError) as exc:
            log_line(self.log, f"agentrt proxy: the manifest of server {shown} changed, but was "
                     f"not taken: {sanitize(str(exc))}; the proxy keeps the one it "
                     "had")  # fmt: skip
            return False
        lines = [
            *str(report).splitlines(),
            *self.proxy.admit([(tool, upstream) for tool in tools], replacing=True),
        ]
        for line in lines:
            log_line(self.log, f"agentrt proxy: {line}")
        log_line(self.log, f"agentrt proxy: server {shown}: took its new manifest")
        watch = self.live.watches.get(name)
        if watch is not None:
            # Listed again against the new pins: what changed is said and recorded there.
            watch.manifest = manifest
            watch.wanted.set()
        if self.proxy.visible_tools() != before:
            await self.proxy.listeners.tools_changed()
        return True
