"""`Upstream`: one loaded server's session, shared by its tools, started again after it died.

A server that exited or was killed is started again on the next call to any
of its tools, its tools are listed again and held to their pins exactly as
`load` held them: a tool whose description, schema or annotations changed is
refused until the operator pins it again, while the others keep working.
The operator is told each time, in one line.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from typing import Final

import anyio

from ..sanitize import sanitize
from . import _revision
from ._connection import Connection, RawTool
from ._context import CallContext
from ._server import Server

__all__ = ["Recheck", "RestartFailed", "Upstream", "stderr_line"]

Recheck = Callable[[list[RawTool]], dict[str, str]]
"""Given a new listing, the refusal reason of each loaded tool that no longer passes load."""

# Left of the caller's deadline for the call itself when a restart ends.
_DEADLINE_MARGIN: Final = 0.05


class RestartFailed(Exception):
    """The server could not be started again; the call was not sent.  One sentence."""


def stderr_line(line: str) -> None:
    """The default operator notice: one line on this process's stderr."""
    sys.stderr.write(f"agentrt: {line}\n")
    sys.stderr.flush()


class Upstream:
    """A loaded server's connection, restarted before a call when the server is gone.

    `refusal(tool)` says why a loaded tool may not be called since the last
    restart ("" when it may).  `log` receives one line per restart or failed
    restart, already escaped.
    """

    def __init__(self, server: Server, connection: Connection, log: Callable[[str], None]) -> None:
        self.server = server
        self.connection = connection
        self.recheck: Recheck | None = None
        self._log = log
        self._refused: dict[str, str] = {}
        self._checked = True  # the tools were held to their pins since the last start
        self._lock = anyio.Lock()
        # What made the refusals in force: a restart, or the server's own list_changed.
        self.refused_since = "its server was started again"
        # The revision it spoke when loaded: a restart that finds the other era is refused.
        self._revision = connection.protocol_version
        # A call its server refused for its headers is retried only if the tool, listed
        # again, still matches its pin (`Connection._retry_after_header_mismatch`).
        connection.on_tools_relisted = self._relisted_for_retry

    def refusal(self, tool: str) -> str:
        return self._refused.get(tool, "")

    @property
    def refused(self) -> dict[str, str]:
        """Each loaded tool refused now, with its reason."""
        return dict(self._refused)

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[bool]:
        """Hold the session alone (no restart or relisting meanwhile); yields whether the
        server is up."""
        async with self._lock:
            yield self._why_restart() is None

    def adopt(self, refused: dict[str, str], since: str) -> None:
        """Take the refusals a new manifest's check found (`take_manifest`)."""
        self._refused = dict(refused)
        self.refused_since = since

    async def relist(self) -> list[RawTool] | None:
        """List the tools again (the server said they changed) and hold each loaded tool to
        its pin exactly as `load` did; the listing, or None when the server is down (the
        next call starts it again and lists then).  Bounded by `server.connect_timeout`;
        never at the same time as a restart."""
        async with self._lock:
            if self._why_restart() is not None:
                return None
            with anyio.fail_after(self.server.connect_timeout):
                listing = await self.connection.list_tools()
            assert self.recheck is not None
            self._refused = self.recheck(listing)
            self.refused_since = "its server listed its tools again"
            return listing

    def _relisted_for_retry(self, tool: str, listing: list[RawTool]) -> str:
        """Hold a listing made to retry a call to the pins, as `relist` does; why `tool`
        may not be called now ("" when it may)."""
        if self.recheck is None:
            return ""
        self._refused = self.recheck(listing)
        self.refused_since = "its server listed its tools again"
        return self._refused.get(tool, "")

    async def watch_idle(self) -> None:
        """Read the server's messages while no request is in flight, until the connection
        closes (`Connection.watch_idle`); a server that dies meanwhile is told to the
        operator at once, in one line, and started again at its next call."""
        try:
            await self.connection.watch_idle(on_lost=self._lost_while_idle)
        except Exception as exc:
            # Reading between requests is a courtesy: its failure must not stop the proxy.
            self._log(
                f'reading server "{sanitize(self.server.name)}" while no request was in '
                f"flight failed ({sanitize(str(exc) or type(exc).__name__)}); what it sends "
                "between requests is read at its next request"
            )

    def _lost_while_idle(self, why: str) -> None:
        self._log(
            f"{sanitize(why)} while no request was in flight; it is started again at its next call"
        )

    async def ready(self, context: CallContext | None = None) -> None:
        """Return once the session can take a request, restarting the server if it died.

        The restart is bounded by `server.connect_timeout` and ends before the
        caller's own deadline, so a restart that cannot finish fails the call
        as not sent instead of cutting it off.  Raises `RestartFailed`.  A
        restart made here is made for `context`'s call (its log lines go there).
        """
        if self._why_restart() is None:
            return
        limit = self.server.connect_timeout
        deadline = anyio.current_effective_deadline()
        if deadline != float("inf"):
            limit = max(0.0, min(limit, deadline - anyio.current_time() - _DEADLINE_MARGIN))
        name = sanitize(self.server.name)
        why: str | None = None
        try:
            with anyio.fail_after(limit):
                async with self._lock:
                    why = self._why_restart()
                    if why is None:
                        return  # another call restarted it while this one waited
                    await self._restart(why, context)
        except TimeoutError:
            if why is not None:
                self._log(f"{sanitize(why)}; starting it again took longer than {limit:g}s")
            raise RestartFailed(
                f'server "{name}" is down and was not started again within {limit:g}s'
            ) from None

    def _why_restart(self) -> str | None:
        why = self.connection.needs_restart()
        if why is None and not self._checked:
            why = f'the tools of server "{sanitize(self.server.name)}" were not listed again'
        return why

    async def _restart(self, why: str, context: CallContext | None) -> None:
        name = sanitize(self.server.name)
        self._checked = False
        try:
            await self.connection.restart(context=context)
            changed = _revision.revision_change(
                self.server.name, self._revision, self.connection.protocol_version
            )
            if changed is not None:
                self._checked = False
                raise RuntimeError(changed)
            listing = await self.connection.list_tools(context=context)
            assert self.recheck is not None
            self._refused = self.recheck(listing)
            self.refused_since = "its server was started again"
            self._checked = True
        except Exception as exc:
            reason = sanitize(str(exc))
            self._log(f"{sanitize(why)}; starting it again failed: {reason}")
            raise RestartFailed(
                f'server "{name}" is down and could not be started again: {reason}'
            ) from None
        line = f"{sanitize(why)}; started it again and listed its tools"
        if self._refused:
            refused = "; ".join(
                f"refused {sanitize(tool)}: {sanitize(reason)}"
                for tool, reason in sorted(self._refused.items())
            )
            line += f" ({refused})"
        else:
            line += " (every loaded tool still matches its pin)"
        self._log(line)
