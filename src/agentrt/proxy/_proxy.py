"""The proxy's state for one process, and the task each host call runs in.

`Proxy` is built once the upstream servers loaded: the store, the call index
and what a host's listing shows.  The gate over the loaded tools (each
watched for a call cut off before its server answered), the proxy's policy
and `Calls` are its call path (`_call_path`), imported and built at the
first call, or warmed just after the first listing, so that listing never
waits on them (decision 0066).  `Proxy.start` hands a host's call to
`Calls` in a task the proxy owns, not the host's request: a host that
cancels a call stops waiting for it, but the upstream call finishes and is
recorded, and an identical call then gets it as `DUPLICATE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Final

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from ..canonical import canonical_json, plain_json
from ..errors import RegistrationError
from ..mcp._tool import ServerTool
from ..policy import Outcome
from ..sanitize import sanitize
from ..store import Principal, Store
from ..tools import Tool, ToolSpec
from ._answers import Answer, bounded, listed_output_schema
from ._flows import host_session_of, new_stdio_session
from ._forward import Forwarded
from ._index import CallIndex, new_owner
from ._input_required import HostCall, Suspended, is_stateless
from ._live import HostListeners
from ._log import log_line
from ._logins import oauth_preflights
from ._offers import Offered, OfferTool, hidden_name
from ._resource import PRINCIPAL_SCOPE_KEY, ProtectedResource
from ._revision import wanted_log_level
from ._status import STATUS_TOOL, GateStatus
from .config import DEFAULT_SERVER_TIMEOUT, ProxyConfig, UpstreamConfig

if TYPE_CHECKING:
    # The SDK's request context, or the stdio front's (`_dispatch`), which has its shape.
    from mcp.server.context import ServerRequestContext

    from ._call_path import CallPath

__all__ = ["Loaded", "Proxy", "log_line"]

# A loaded tool, and the configuration of the server it came from.
Loaded = tuple[Tool, UpstreamConfig]

# The call path's module, imported at the first call or warmed after the first listing.
_CALL_PATH: Final = "agentrt.proxy._call_path"
# How long after the first listing the call path is warmed: the listing's answer is
# written by then, so the import neither competes with it for the interpreter nor counts
# in what the host waited for; a call that comes sooner imports it itself.
_WARM_AFTER_LISTING: Final = 0.05

_LOG_LEVELS: Final = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)


@dataclass
class _InFlight:
    """Calls the proxy is still working on, so shutdown can wait for them."""

    count: int = 0
    idle: anyio.Event = field(default_factory=anyio.Event)

    def enter(self) -> None:
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self.idle.set()

    async def wait(self) -> None:
        while self.count:
            self.idle = anyio.Event()
            await self.idle.wait()


class Proxy:
    """The proxy's state for one process: store, index, what a listing shows, the calls in
    flight, and the call path once built (`calling`)."""

    def __init__(
        self,
        config: ProxyConfig,
        store: Store,
        tools: list[Loaded],
        log: IO[str],
        offered: Offered | None = None,
    ) -> None:
        self.config = config
        self.offered = offered if offered is not None else Offered()
        # The tools as loaded, which the call path wraps for the gate when it is built.
        self.loaded = list(tools)
        # Each served tool's server, for the operator's client_requests rule of its call.
        self.server_of: dict[str, UpstreamConfig] = {tool.spec.name: up for tool, up in tools}
        # How long a suspended call waits for a stateless host's answer: the call's timeout.
        self.timeouts = {tool.spec.name: tool.spec.timeout for tool, _ in tools}
        # The request states issued to stateless hosts, each naming a suspended call.
        self.suspended = Suspended()
        # Each loaded server's session, for the requests that are not calls (logging/setLevel).
        self.upstreams = {
            up.server.name: tool.upstream for tool, up in tools if isinstance(tool, ServerTool)
        }
        # The server tools by final name, so a tool its server's new listing refused is
        # withheld from the host's listing (`_live.py`); and the hosts to tell it changed.
        self.server_tools = {
            tool.spec.name: tool for tool, _ in tools if isinstance(tool, ServerTool)
        }
        self.listeners = HostListeners()
        self.store = store
        self.log = log
        self.owner = new_owner()
        # Made here, not at the first call: its tables are migrated now, so a database
        # whose proxy tables are from a newer build is refused at start, as before.
        self.index = CallIndex(store, config.session, self.owner, config.lease_ttl)
        # `"principals"`: the HTTP listener's token checks (`_resource.py`); unused over stdio.
        self.resource = (
            ProtectedResource(config.principals) if config.principals is not None else None
        )
        # Shared by every watched tool, those a late server brings too (`admit`): the calls
        # cut off before their server answered, those sent, and the results to forward.
        self.cut_off: set[tuple[str, int]] = set()
        self.sent: set[str] = set()
        self.forwarded: dict[str, Forwarded] = {}
        # The server's own `title` and `outputSchema`, listed for results forwarded as sent.
        self.listed: dict[str, tuple[str | None, dict[str, Any] | None]] = {}
        # MCP Apps: each tool's `_meta` naming its app, offered to hosts that render apps.
        self.ui: dict[str, dict[str, Any]] = {
            tool.spec.name: tool.ui for tool, _ in tools if isinstance(tool, ServerTool) and tool.ui
        }
        for tool, upstream in tools:
            self.list_as_sent(tool, upstream)
        # The specs served by name, in the gate's order: what a listing shows and a call
        # finds its tool by (shared with `Calls`).
        self.specs: dict[str, ToolSpec] = {tool.spec.name: tool.spec for tool, _ in tools}
        # prompts/get and resources/read of each server that offers them: read-only gate tools
        # the host never sees, so each one is recorded and decided like a call.
        self.hidden: set[str] = set()
        self.offer_tools: list[OfferTool] = []
        self.resource_rules: dict[str, tuple[tuple[str, Outcome], ...]] = {}
        taken = set(self.specs)
        for position, upstream in enumerate(config.servers):
            name = upstream.server.name
            offering = self.offered.upstreams.get(name)
            if offering is None or not self.offered.offers_anything(name):
                continue
            get_name = hidden_name("prompt", name, position)
            read_name = hidden_name("resource", name, position)
            if get_name in taken or read_name in taken:
                log_line(log, f"agentrt proxy: server {sanitize(name)}: its prompts and resources "
                     "are not offered: a tool already has the proxy's name for them")  # fmt: skip
                self.offered.drop(name)
                continue
            self.offered.tools[name] = (get_name, read_name)
            for tool_name, method in ((get_name, "prompts/get"), (read_name, "resources/read")):
                offer = OfferTool(
                    name=tool_name,
                    method=method,
                    server=name,
                    upstream=offering,
                    timeout=upstream.server.default_timeout or DEFAULT_SERVER_TIMEOUT,
                    max_result_bytes=upstream.max_result_bytes,
                    forwarded=self.forwarded,
                    apps=self.offered.apps,
                )
                self.offer_tools.append(offer)
                self.specs[tool_name] = offer.spec
                self.hidden.add(tool_name)
            self.resource_rules[read_name] = upstream.resource_rules
        self.server_names = _servers_by_tool(config)
        self.status = GateStatus(store, self.index, functools.partial(log_line, log))
        self.status.withheld = self.withheld
        # The host session of this process's stdio host (docs/flows.md), when labels are used.
        self.stdio_session = new_stdio_session() if config.labelled else None
        self.in_flight = _InFlight()
        # Set once the proxy takes no more calls (`_lifecycle.running`, stdin's end).
        self.closing = anyio.Event()
        # Set while the proxy serves (`_lifecycle.running`): calls are taken only then.
        self.work: TaskGroup | None = None
        self.call_tasks: set[asyncio.Task[None]] = set()
        # The level a host set with logging/setLevel; None forwards no server logging.
        self.log_level: str | None = None
        # Approve in the host (`_host_approval.py`): only when configured, and only while the
        # proxy serves one host (stdio; `_lifecycle` says so), never many principals.
        self.host_approval = config.approve_in_host
        self.single_host = False
        # A remote server's OAuth tokens are checked (and refreshed) before its call
        # enters the gate: one that needs a login is UNAVAILABLE, nothing recorded or run.
        self.logins = oauth_preflights(tools)
        # The call path once something asked for it (a call, the warm-up, `call_path`): a
        # future, done once it is built; its import runs once, for every task that waits.
        self._call_path: asyncio.Future[CallPath] | None = None
        if builds_at_start(config):
            self.call_path()

    def list_as_sent(self, tool: Tool, upstream: UpstreamConfig) -> None:
        """Keep the server's own `title` and `outputSchema` of `tool` for its listing, when
        its results are forwarded as sent."""
        if not isinstance(tool, ServerTool):
            return
        as_sent = upstream.results == "as_sent"
        schema = plain_json(tool.output_schema) if as_sent and tool.output_schema else None
        self.listed[tool.spec.name] = (
            tool.title,
            None if schema is None else listed_output_schema(schema),
        )

    # -- the call path ---------------------------------------------------------

    @property
    def built(self) -> CallPath | None:
        """The call path if it is built: not before the first call or the warm-up, unless
        the configuration builds it at start (`builds_at_start`)."""
        path = self._call_path
        return path.result() if path is not None and _succeeded(path) else None

    def call_path(self) -> CallPath:
        """The call path, built now if it is not yet (its modules imported on this thread
        if no worker has): for what needs it outside a call, rarely (a tool admitted while
        serving, the rules taken again, the inbox)."""
        path = self.built
        if path is None:
            # Waits for a worker's import of the module, if one is under way; that worker's
            # task then finds the path built here (`_import_and_build`).
            from ._call_path import build_call_path

            path = build_call_path(self)
            self._call_path = asyncio.get_running_loop().create_future()
            self._call_path.set_result(path)
        return path

    async def calling(self) -> CallPath:
        """The call path, its modules imported in a worker thread by the first task that
        needs it (a call, or the warm-up after the first listing), then built once: what a
        call awaits first.  A task that comes meanwhile awaits that same import; one that
        comes after it failed tries again."""
        path = self._call_path
        if path is None or (path.done() and not _succeeded(path)):
            path = self._call_path = asyncio.get_running_loop().create_task(
                self._import_and_build()
            )
        # Shielded: a call cancelled while it waits leaves the import to the others.
        return await asyncio.shield(path)

    async def _import_and_build(self) -> CallPath:
        await anyio.to_thread.run_sync(importlib.import_module, _CALL_PATH)
        return self.call_path()

    def listed_once(self) -> None:
        """A host was answered a tools listing: warm the call path shortly after, off the
        listing's path, so the first call finds it imported (decision 0066)."""
        if self._call_path is None and self.work is not None:
            self.work.start_soon(self._warm)

    async def _warm(self) -> None:
        await anyio.sleep(_WARM_AFTER_LISTING)
        if self.closing.is_set():
            return
        try:
            await self.calling()
        except Exception as exc:
            # Not the serving's end: the first call builds it again, and answers its failure.
            log_line(self.log, "agentrt proxy: the call path could not be prepared: "
                     f"{sanitize(str(exc))}")  # fmt: skip

    def admit(self, tools: list[Loaded], *, replacing: bool = False) -> list[str]:
        """Serve the tools of a server that loaded after the proxy started (its login came
        later, `_logins.py`), or with `replacing` those its new manifest registered in place
        of its own (`_reload.py`), held to its pins as at start; the lines to log.  A name
        another server holds goes to neither silently: the late tool is refused."""
        from ._call_path import watched
        from ._preconditions import StatefulTool

        path = self.call_path()
        lines: list[str] = []
        repeat_windows: dict[str, float] = {}
        for tool, upstream in tools:
            name = tool.spec.name
            holder = self.server_of.get(name)
            own = replacing and holder is not None and holder.server.name == upstream.server.name
            if not own and (name in self.specs or name == STATUS_TOOL):
                lines.append(f"server {sanitize(upstream.server.name)}: refused {name}: the "
                             "name is already taken; give it a rename rule")  # fmt: skip
                continue
            self.list_as_sent(tool, upstream)
            wrapped = watched(self, tool, upstream, tools, repeat_windows)
            if isinstance(wrapped, StatefulTool):
                wrapped.policy = path.policy
            try:
                # A name retired from a tool (`retire`) is still in the gate, served by no one.
                path.gate.register(wrapped, replacing=own or name not in self.specs)
            except RegistrationError as exc:
                lines.append(f"server {sanitize(upstream.server.name)}: refused {name}: "
                             f"{sanitize(str(exc))}")  # fmt: skip
                continue
            self.specs[name] = tool.spec
            self.server_of[name] = upstream
            self.timeouts[name] = tool.spec.timeout
            if isinstance(tool, ServerTool):
                self.server_tools[name] = tool
                self.upstreams[upstream.server.name] = tool.upstream
                if tool.ui:
                    self.ui[name] = tool.ui
                else:
                    self.ui.pop(name, None)
            self.logins.update(oauth_preflights([(tool, upstream)]))
        path.calls.repeat_windows.update(repeat_windows)
        return lines

    def retire(self, name: str) -> None:
        """Stop serving `name`, a tool's old name a changed rule renamed (`_rules_reload.py`):
        listed to no host, a call to it answered as to a name that never was a tool.  The
        gate cannot unregister a tool, so it stays there, out of reach, and the name can be
        given to a tool again (`admit`)."""
        self.specs.pop(name, None)
        self.logins.pop(name, None)
        self.server_tools.pop(name, None)
        self.ui.pop(name, None)

    def serves(self, tool: str) -> bool:
        """Whether `tool` is offered to the host now: not refused since its server listed
        its tools again (or was started again)."""
        server_tool = self.server_tools.get(tool)
        return server_tool is None or not server_tool.upstream.refusal(server_tool.server_tool_name)

    def withheld(self) -> list[tuple[str, str]]:
        """Each tool refused since its server listed its tools again (or was started
        again), by name, with the reason."""
        found = []
        for name, tool in sorted(self.server_tools.items()):
            reason = tool.upstream.refusal(tool.server_tool_name)
            if reason:
                found.append((name, reason))
        return found

    def visible_tools(self) -> frozenset[str]:
        """The tool names a host's `tools/list` shows now (besides `gate_status`)."""
        return frozenset(
            spec.name
            for spec in self.specs.values()
            if spec.name not in self.hidden and self.serves(spec.name)
        )

    def start(
        self,
        ctx: ServerRequestContext[Any],
        tool: str,
        arguments: dict[str, Any] | None,
        request_meta: Any,
    ) -> HostCall | Answer:
        """Hand the call to the gate in a task the proxy owns; its answer arrives on the
        returned `HostCall`."""
        if self.closing.is_set() or self.work is None:
            return Answer.unrecorded()
        call = HostCall(ctx, tool, arguments)
        principal = principal_of_request(ctx)
        host_session = (
            None
            if self.stdio_session is None
            else host_session_of(
                getattr(ctx.request, "headers", None),
                self.stdio_session,
                self.config.flows.stateless_session,
            )
        )
        meta = request_meta or {}
        wants_progress = meta.get("progress_token", meta.get("progressToken")) is not None

        async def progress(elapsed: float, message: str) -> None:
            if not call.waiting:
                return
            # A host that went away must not break the call it left behind.
            with contextlib.suppress(Exception):
                await call.ctx.session.report_progress(elapsed, None, message)

        async def upstream_progress(value: float, total: float | None, text: str | None) -> None:
            # The server's progress for this call, under the host's own token.
            if call.waiting and wants_progress:
                with contextlib.suppress(Exception):
                    await call.ctx.session.report_progress(
                        value, total, sanitize(text)[:500] if text is not None else None
                    )

        async def upstream_log(level: str, logger: str | None, data: Any) -> None:
            # Only at or above the level the host set; sanitized, like any server text.
            # A server's log lines are the host session's, not this call's: whichever call
            # reads them passes them on, a call its host gave up on included (it goes on,
            # and may be the one reading the server's stdout for the others).
            wanted = wanted_log_level(
                meta, self.log_level, stateless=is_stateless(call.ctx.protocol_version)
            )
            if wanted is None or level not in _LOG_LEVELS:
                return
            if _LOG_LEVELS.index(level) < _LOG_LEVELS.index(wanted):
                return
            text = data if isinstance(data, str) else canonical_json(data)
            with contextlib.suppress(Exception):
                await call.ctx.session.send_log_message(
                    level,  # type: ignore[arg-type]
                    bounded(text, 2000),
                    logger=bounded(logger, 100) if logger is not None else None,
                )

        upstream = self.server_of.get(tool)
        timeout = self.timeouts.get(tool, DEFAULT_SERVER_TIMEOUT)
        spec = self.specs.get(tool)
        host_ask = (
            self.host_approval.asker(
                self.store, ctx, spec, self.server_names.get(tool), self.log, call=call
            )
            if self.host_approval is not None and self.single_host and spec is not None
            else None
        )

        async def work() -> None:
            answer = Answer.unavailable("the gate could not complete this call.")
            try:
                # The first call imports and builds the call path (decision 0066).
                path = await self.calling()
                from ._call_path import upstream_context  # imported: the path is built

                context = upstream_context(
                    call, upstream, self.store, timeout, meta,
                    progress=upstream_progress if wants_progress else None, log=upstream_log,
                )  # fmt: skip
                answer = await path.calls.handle(
                    tool,
                    arguments,
                    progress,
                    request_meta,
                    context=context,
                    host_session=host_session,
                    host_ask=host_ask,
                    principal=principal,
                )
            except Exception as exc:
                log_line(self.log, f"agentrt proxy: a call to {sanitize(tool)} failed: "
                         f"{sanitize(str(exc))}")  # fmt: skip
            finally:
                self.in_flight.leave()
                call.finish(answer)

        self.in_flight.enter()
        # A bare asyncio task, not a child of `work`: `running` waits for every call
        # through `in_flight` before the group ends, and `work` catches its own failures,
        # so the group's bookkeeping bought nothing for ~3% of a proxied call's CPU.
        task = asyncio.get_running_loop().create_task(work())
        self.call_tasks.add(task)
        task.add_done_callback(self.call_tasks.discard)
        return call


def builds_at_start(config: ProxyConfig) -> bool:
    """Whether the call path is built with the proxy, as before decision 0066, rather than
    at the first call: when building it writes to the database or refuses the rules, which
    start must still do (standing grants write the operator's maximum; labels migrate the
    taint's tables; a precondition's reading tool must have loaded)."""
    return (
        config.standing_grants is not None
        or config.labelled
        or any(
            rule.precondition is not None
            for upstream in config.servers
            for rule in upstream.tool_rules.values()
        )
    )


def _succeeded(future: asyncio.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def principal_of_request(ctx: ServerRequestContext[Any]) -> Principal | None:
    """The principal the HTTP doorkeeper proved for this request (None over stdio, or
    without `"principals"`): left in the request's ASGI scope, never read from a header
    here."""
    scope = getattr(ctx.request, "scope", None)
    principal = scope.get(PRINCIPAL_SCOPE_KEY) if isinstance(scope, Mapping) else None
    return principal if isinstance(principal, Principal) else None


def _servers_by_tool(config: ProxyConfig) -> dict[str, str]:
    """The server of each final tool name, as `load` names the tool."""
    return {
        rule.rename if rule.rename is not None else f"{upstream.server.name}_{tool}": (
            upstream.server.name
        )
        for upstream in config.servers
        for tool, rule in upstream.rules.items()
    }
