"""The MCP server the host talks to: the loaded tools, `gate_status`, and the lifecycle.

Each `tools/call` is handed to `Calls` in a task the proxy owns, not the
host's request: a host that cancels a call stops waiting for it, but the
upstream call finishes and is recorded, and an identical call then gets it
as `DUPLICATE`.  On stdin close, SIGINT or SIGTERM the proxy takes no more
calls, lets the ones in flight finish and be recorded, closes its upstream
servers and exits.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import IO, Any, Final

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server as LowLevelServer

from ..canonical import canonical_json
from ..errors import AgentrtError, RunNotFound, StoreError
from ..gate import Gate, Limits
from ..mcp import Connection, Report, load, read_manifest
from ..sanitize import sanitize
from ..store import ApprovalStatus, Store, open_store
from ..tools import SideEffect, Tool
from ._answers import Answer, bounded
from ._calls import Calls, WatchedTool, new_owner, proxy_policy
from ._index import CallIndex
from ._stdio import stdio_wire
from .config import ConfigError, ProxyConfig, UpstreamConfig, load_config

__all__ = ["STATUS_TOOL", "serve", "serve_config"]

STATUS_TOOL: Final = "gate_status"
_STATUS_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "approval_id": {
            "type": "string",
            "description": "The approval id a PENDING_APPROVAL answer named (optional).",
        }
    },
    "additionalProperties": False,
}
_STATUS_DESCRIPTION: Final = (
    "Say which of this session's requests wait for a person's approval, or, given an "
    "approval_id, what became of that request. It only reads; it never runs, approves or "
    "changes anything."
)

Scope = Callable[[], Awaitable[None]]


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


def _plain(value: Any) -> Any:
    """A parsed JSON value (Decimal numbers) as plain Python the SDK's models accept."""
    return json.loads(canonical_json(value))


def _log(stream: IO[str], line: str) -> None:
    stream.write(line + "\n")
    stream.flush()


async def _load_upstreams(config: ProxyConfig, log: IO[str]) -> tuple[list[Tool], list[Connection]]:
    """Load every upstream; one that fails is reported and left out, the others serve."""
    tools: list[Tool] = []
    connections: list[Connection] = []
    taken: dict[str, str] = {STATUS_TOOL: "the proxy itself"}
    outcomes: list[tuple[list[Tool], Report] | Exception | None] = [None] * len(config.servers)
    for upstream in config.servers:
        if upstream.server.command is not None and upstream.server.sandbox is None:
            _log(
                log,
                f"agentrt proxy: warning: server {sanitize(upstream.server.name)} has no "
                "sandbox, so it runs with every file and network this user can reach",
            )

    async def load_one(position: int, upstream: UpstreamConfig) -> None:
        try:
            manifest = read_manifest(upstream.manifest_path)
            outcomes[position] = await load(upstream.server, manifest, upstream.rules)
        except (AgentrtError, OSError, ValueError) as exc:
            outcomes[position] = exc

    # Together, so the host waits for the slowest server, not for the sum of them.
    async with anyio.create_task_group() as group:
        for position, upstream in enumerate(config.servers):
            group.start_soon(load_one, position, upstream)
    for upstream, outcome in zip(config.servers, outcomes, strict=True):
        name = sanitize(upstream.server.name)
        if not isinstance(outcome, tuple):
            _log(log, f"agentrt proxy: server {name} did not load: {sanitize(str(outcome))}")
            continue
        loaded, report = outcome
        if report.connection is not None:
            connections.append(report.connection)
        for line in str(report).splitlines():
            _log(log, f"agentrt proxy: {line}")
        for tool in loaded:
            holder = taken.get(tool.spec.name)
            if holder is not None:
                # A second tool of one name would shadow the first; neither is guessed at.
                _log(
                    log,
                    f"agentrt proxy: server {name}: refused {tool.spec.name}: the name is "
                    f"already taken by {sanitize(holder)}; give it a rename rule",
                )
                continue
            taken[tool.spec.name] = f'server "{upstream.server.name}"'
            tools.append(tool)
    return tools, connections


class Proxy:
    """The proxy's state for one process: store, index, gate and the host-facing server."""

    def __init__(self, config: ProxyConfig, store: Store, tools: list[Tool], log: IO[str]) -> None:
        self.config = config
        self.store = store
        self.log = log
        owner = new_owner()
        self.index = CallIndex(store, config.session, owner, config.lease_ttl)
        cut_off: set[tuple[str, int]] = set()
        self.policy = proxy_policy(config, store)
        self.gate = Gate(
            store,
            [WatchedTool(tool, cut_off) for tool in tools],
            policy=self.policy,
            limits=Limits(approval_ttl=config.approval_ttl, grant_ttl=config.grant_ttl),
            owner=owner,
            lease_ttl=config.lease_ttl,
        )
        self.calls = Calls(
            gate=self.gate,
            index=self.index,
            policy=self.policy,
            cut_off=cut_off,
            session=config.session,
            database=str(config.database),
            hold=config.hold,
            repeat_window=config.repeat_window,
            max_pending=config.max_pending,
            log=log,
        )
        self.in_flight = _InFlight()
        self.work: TaskGroup | None = None

    # -- the host-facing server ----------------------------------------------

    def server(self) -> LowLevelServer[Any]:
        return LowLevelServer(
            "agentrt-proxy",
            version="0.1.0",
            instructions=(
                "Tools here pass through a gate: some calls wait for a person's approval. "
                "Read each answer's first word; follow what it says."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        # The hints a host sees are the operator's classification, never the server's claims.
        tools = [
            types.Tool(
                name=spec.name,
                description=spec.description,
                input_schema=_plain(spec.input_schema),
                annotations=types.ToolAnnotations(
                    read_only_hint=spec.side_effect is SideEffect.READ_ONLY,
                    destructive_hint=spec.side_effect is SideEffect.DESTRUCTIVE,
                ),
            )
            for spec in self.calls.specs
        ]
        tools.append(
            types.Tool(
                name=STATUS_TOOL,
                description=_STATUS_DESCRIPTION,
                input_schema=dict(_STATUS_SCHEMA),
                annotations=types.ToolAnnotations(read_only_hint=True),
            )
        )
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name == STATUS_TOOL:
            answer = self.status(params.arguments)
        else:
            answer = await self._gated_call(ctx, params)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=answer.text)], is_error=answer.is_error
        )

    async def _gated_call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> Answer:
        if self.calls.closing.is_set() or self.work is None:
            return Answer.unrecorded()
        done = anyio.Event()
        box: list[Answer] = []
        host_waiting = True

        async def progress(elapsed: float, message: str) -> None:
            if not host_waiting:
                return
            # A host that went away must not break the call it left behind.
            with contextlib.suppress(Exception):
                await ctx.session.report_progress(elapsed, None, message)

        async def work() -> None:
            try:
                box.append(await self.calls.handle(params.name, params.arguments, progress))
            except Exception as exc:
                _log(self.log, f"agentrt proxy: a call to {sanitize(params.name)} failed: "
                     f"{sanitize(str(exc))}")  # fmt: skip
                box.append(Answer.unavailable("the gate could not complete this call."))
            finally:
                self.in_flight.leave()
                done.set()

        self.in_flight.enter()
        self.work.start_soon(work)
        try:
            await done.wait()
        finally:
            host_waiting = False
        return box[0]

    # -- gate_status ---------------------------------------------------------

    def status(self, arguments: dict[str, Any] | None) -> Answer:
        """Answer from the database alone: never executes, decides or writes a run."""
        arguments = arguments or {}
        unknown = sorted(set(arguments) - {"approval_id"})
        if unknown:
            return Answer.invalid(STATUS_TOOL, f"unknown argument {unknown[0]!r}")
        approval_id = arguments.get("approval_id")
        if approval_id is None:
            waiting = self.index.waiting()
            if not waiting:
                return Answer("No request of this session waits for a person's approval.", False)
            lines = [f"{len(waiting)} request(s) wait for a person's decision:"]
            for row, waits in waiting:
                lines.append(
                    f"- approval {waits.approval_id}: {row.tool} "
                    f"({_status_word(waits.kind)}), waiting since {waits.created_at}"
                )
            return Answer("\n".join(lines), False)
        if not isinstance(approval_id, str):
            return Answer.invalid(STATUS_TOOL, "approval_id must be a string")
        try:
            approval = self.store.get_approval(approval_id)
        except RunNotFound:
            approval = None
        if approval is None or self.index.get(approval.run_id) is None:
            # Another session's approvals are not this model's business.
            return Answer(
                f"There is no approval {bounded(approval_id, 80)} in this session.", False
            )
        described = {
            ApprovalStatus.PENDING: "is waiting for a person's decision",
            ApprovalStatus.APPROVED: (
                "was approved; call the tool again with exactly the same arguments and it runs once"
            ),
            ApprovalStatus.USED: "was approved and the call ran",
            ApprovalStatus.REJECTED: "was rejected",
            ApprovalStatus.EXPIRED: "expired before anyone decided; the call did not run",
            ApprovalStatus.SUPERSEDED: "was replaced by a newer request for the same call",
        }[approval.status]
        note = (
            f' The reviewer said: "{bounded(approval.note)}".'
            if approval.status is ApprovalStatus.REJECTED and approval.note
            else ""
        )
        return Answer(
            f"Approval {approval.approval_id} for {approval.tool} {described}.{note}", False
        )

    # -- lifecycle -----------------------------------------------------------

    async def _renew_holds(self) -> None:
        while True:
            await anyio.sleep(self.config.lease_ttl / 3)
            with contextlib.suppress(Exception):
                self.index.renew_holds()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Own the calls' tasks; on exit take no more calls and wait for those in flight."""
        async with anyio.create_task_group() as work:
            self.work = work
            work.start_soon(self._renew_holds)
            try:
                yield
            finally:
                self.calls.closing.set()
                with anyio.CancelScope(shield=True):
                    await self.in_flight.wait()
                work.cancel_scope.cancel()


def _status_word(kind: str) -> str:
    if kind == "interrupted_side_effect":
        return "an earlier attempt was cut off"
    if kind == "unknown_outcome":
        return "an earlier attempt's outcome is unknown"
    return "needs approval"


async def _watch_signals(stop: Callable[[], object], log: IO[str]) -> None:
    """On SIGINT or SIGTERM, stop taking calls; those in flight finish and are recorded."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for received in signals:
            _log(log, f"agentrt proxy: {signal.Signals(received).name}: finishing calls in flight")
            stop()
            return


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _split_http(http: str) -> tuple[str, int]:
    host, colon, port = http.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ConfigError(f"--http {sanitize(http)} is not HOST:PORT")
    return host.strip("[]"), int(port)


class _RequireToken:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <token>`."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
                await send(
                    {"type": "http.response.start", "status": 401,
                     "headers": [(b"content-type", b"text/plain")]}
                )  # fmt: skip
                await send({"type": "http.response.body", "body": b"a bearer token is required\n"})
                return
        await self.app(scope, receive, send)


async def _serve_http(
    server: LowLevelServer[Any], host: str, port: int, token: str | None, log: IO[str]
) -> None:
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    security = None
    if not _is_loopback(host):
        # A remote listener is guarded by the bearer token, not by Host checks.
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app: Any = server.streamable_http_app(host=host, transport_security=security)
    if token is not None:
        app = _RequireToken(app, token)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")

    class _Server(uvicorn.Server):
        # uvicorn re-raises the signal it caught once it stops, which would end
        # the process before the calls in flight are recorded and the upstream
        # servers closed; the proxy's own watcher stops it instead.
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    server_http = _Server(config)

    def stop() -> None:
        server_http.should_exit = True

    _log(log, f"agentrt proxy: serving streamable HTTP on http://{host}:{port}/mcp")
    async with anyio.create_task_group() as group:
        group.start_soon(_watch_signals, stop, log)
        await server_http.serve()
        group.cancel_scope.cancel()


async def serve_config(
    config: ProxyConfig,
    *,
    http: str | None = None,
    allow_remote: bool = False,
    token: str | None = None,
    log: IO[str] | None = None,
) -> int:
    """Serve `config` until the host leaves or a signal arrives; returns the exit status."""
    stream = log if log is not None else sys.stderr
    address: tuple[str, int] | None = None
    if http is not None:
        address = _split_http(http)
        if not _is_loopback(address[0]) and not (allow_remote and token):
            raise ConfigError(
                f"--http {sanitize(http)} is not a loopback address; serving other hosts "
                "needs --allow-remote and a --token"
            )
    store = open_store(config.database)
    connections: list[Connection] = []
    try:
        tools, connections = await _load_upstreams(config, stream)
        proxy = Proxy(config, store, tools, stream)
        server = proxy.server()
        async with proxy.running():
            if address is not None:
                await _serve_http(server, address[0], address[1], token, stream)
            else:
                with anyio.CancelScope() as serving:
                    async with anyio.create_task_group() as group:
                        group.start_soon(_watch_signals, serving.cancel, stream)
                        async with stdio_wire() as (read_stream, write_stream):
                            await server.run(
                                read_stream, write_stream, server.create_initialization_options()
                            )
                        group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            for connection in connections:
                with contextlib.suppress(Exception):
                    await connection.aclose()
        store.close()
    return 0


def serve(
    config_path: str,
    *,
    http: str | None = None,
    allow_remote: bool = False,
    token: str | None = None,
) -> int:
    """`agentrt proxy --config FILE`: load the configuration and serve until the host leaves.

    Loopback only unless `allow_remote` with a `token`.  Returns the exit
    status: 0 after a clean shutdown, 1 when the configuration is refused,
    2 when the database cannot be used (the reason is written to stderr).
    """
    try:
        config = load_config(config_path)
        return anyio.run(
            lambda: serve_config(config, http=http, allow_remote=allow_remote, token=token)
        )
    except StoreError as exc:
        # An unusable database is exit 2, as for every other subcommand.
        _log(sys.stderr, f"agentrt proxy: {exc}")
        return 2
    except (ConfigError, AgentrtError) as exc:
        _log(sys.stderr, f"agentrt proxy: {exc}")
        return 1
    except OSError as exc:
        _log(sys.stderr, f"agentrt proxy: {sanitize(str(exc))}")
        return 1
