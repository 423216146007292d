"""The proxy's life: start-up, serving a host, signals and shutdown.

Over stdio the stdio servers are started as soon as the configuration is
read, before this module and the rest of the proxy are imported (`_serve`,
decision 0053).  The upstream servers then load together (`_upstreams`) while a worker thread
imports what serving needs and opens the store (decision 0026); then the
proxy serves one host on stdio, or many over HTTP.  On stdin close, SIGINT
or SIGTERM it takes no more calls, lets the ones in flight finish, be
recorded and be answered, closes its upstream servers and exits 0.  Once
stdin has ended, a signal (the official TypeScript client sends SIGTERM two
seconds later) changes nothing; a second signal says the host is about to
kill the proxy, which then kills its upstream servers at once, so each call
in flight is recorded as its server's crash would be, and answered
(decision 0024).  The signals stay caught until the process exits.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import importlib
import os
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import anyio

from ..sanitize import sanitize
from ._log import log_line
from ._stamps import Stamp
from .config import ConfigError, ProxyConfig, UpstreamConfig

if TYPE_CHECKING:
    import asyncio

    from ..mcp import Connection, Manifest
    from ..store import Store
    from ..telemetry import TraceExporter
    from ..tools import Tool
    from ._handlers import Handlers
    from ._proxy import Proxy
    from ._stdio import StdioWire

__all__ = ["event_loop_factory", "running", "serve_config"]


# What serving a host needs beyond loading the servers: the schemas' checks and the
# proxy.  Imported in a worker thread while the servers start; the gate and the rest of
# the call path come at the first call, or just after the first listing (`Proxy.calling`,
# decision 0066).  Over
# stdio the front (`_dispatch`) answers the common methods in plain JSON (`_plain`,
# decision 0061): the protocol's pydantic models (0.44 s of CPU, 25 MiB) and the MCP
# SDK's server (0.6 s more) are imported only if a host needs them (decision 0043); over
# HTTP they serve every request, and come with `_http`.
_SERVING_MODULES: Final = (
    # First (after `prepare_for`, which imports jsonschema only if the pinned schemas
    # name a draft other than 2020-12): what checks each listed tool's schema, which the
    # load reaches as soon as a server has listed its tools.
    "agentrt.schema",
    "agentrt.proxy._proxy",
    "agentrt.proxy._handlers",
)


def _prepare(config: ProxyConfig, http: bool) -> Store:
    """Import what serving needs and open the store: the work that can overlap the
    upstream servers' own start (issue 36).  Runs in a worker thread."""
    front = ("agentrt.proxy._http",) if http else ("agentrt.proxy._dispatch",)
    from ..schema import prepare_for

    for upstream in config.servers:
        # A manifest that cannot be read is the load's to refuse, with its own sentence.
        with contextlib.suppress(OSError):
            prepare_for(upstream.manifest_path.read_bytes())
    for module in (*_SERVING_MODULES, *front):
        importlib.import_module(module)
    from ..store import open_store

    return open_store(config.database)


def _import_the_2026_front() -> None:
    """What a host of the 2026-07-28 era is answered with (`_modern`, in plain JSON,
    decision 0062): imported in the worker thread while the servers load, when the host's
    first message speaks that era (`_peek`), rather than on the event loop once it is read."""
    importlib.import_module("agentrt.proxy._modern")


async def _renew_holds(proxy: Proxy) -> None:
    while True:
        await anyio.sleep(proxy.config.lease_ttl / 3)
        with contextlib.suppress(Exception):
            await proxy.store.run(proxy.index.renew_holds)
        if proxy.built is not None:  # no call yet, nothing to repair
            await proxy.built.calls.repair()


@contextlib.asynccontextmanager
async def running(proxy: Proxy) -> AsyncIterator[None]:
    """Renew the holds while serving; on exit take no more calls and wait for those in
    flight, and for their tasks to end."""
    async with anyio.create_task_group() as work:
        proxy.work = work
        work.start_soon(_renew_holds, proxy)
        try:
            yield
        finally:
            proxy.closing.set()
            with anyio.CancelScope(shield=True):
                await proxy.in_flight.wait()
                if proxy.call_tasks:
                    import asyncio

                    await asyncio.wait(set(proxy.call_tasks))
            work.cancel_scope.cancel()


@dataclass
class _Shutdown:
    """How the proxy stops: asked to (stdin's end or a first signal: calls in flight
    finish), or hurried (a signal after the first: its host is about to kill it)."""

    stopping: anyio.Event = field(default_factory=anyio.Event)
    hurried: bool = False
    # The upstream sessions, once loaded.
    connections: list[Connection] = field(default_factory=list)

    async def hurry(self) -> None:
        """Kill every upstream server now, so each call in flight ends as a server's crash
        ends it: recorded, as an unknown outcome when it changes something, and answered,
        within the host's grace rather than cut off by its SIGKILL with nothing recorded."""
        self.hurried = True
        async with anyio.create_task_group() as group:
            for connection in self.connections:
                group.start_soon(functools.partial(connection.aclose, polite=False))


async def _watch_signals(shutdown: _Shutdown, log: IO[str], *, keep_caught: bool) -> None:
    """On SIGINT or SIGTERM, stop taking calls; those in flight finish, are recorded and
    answered.  A later signal hurries the shutdown (`_Shutdown.hurry`).  On the way out
    the signals are left ignored (`keep_caught`: the process is about to exit, and a
    host's second signal must not kill it while it does), or as they were found."""
    caught = (signal.SIGINT, signal.SIGTERM)
    found = {number: signal.getsignal(number) for number in caught}
    try:
        with anyio.open_signal_receiver(*caught) as signals:
            async for received in signals:
                name = signal.Signals(received).name
                if not shutdown.stopping.is_set():
                    log_line(log, f"agentrt proxy: {name}: finishing calls in flight")
                    shutdown.stopping.set()
                elif not shutdown.hurried:
                    log_line(log, f"agentrt proxy: {name} during shutdown: stopping the upstream "
                         "servers now; calls in flight end with an unknown outcome")  # fmt: skip
                    await shutdown.hurry()
    finally:
        # Leaving the receiver put the default action back (death by the signal).
        for number, handler in found.items():
            if keep_caught:
                signal.signal(number, signal.SIG_IGN)
            else:
                signal.signal(number, handler if handler is not None else signal.SIG_DFL)


async def _serve_stdio(
    handlers: Handlers, proxy: Proxy, log: IO[str], stopping: anyio.Event
) -> None:
    from ._dispatch import StdioFront
    from ._stdio import stdio_wire

    def settled() -> bool:
        return proxy.in_flight.count == 0

    async def stop_when_asked(wire: StdioWire) -> None:
        await stopping.wait()
        wire.stop()

    async with (
        stdio_wire(proxy.closing.set, settled, log) as wire,
        anyio.create_task_group() as group,
    ):
        group.start_soon(stop_when_asked, wire)
        await StdioFront(handlers, wire, log).serve()
        group.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _serving_inbox(
    config: ProxyConfig,
    proxy: Proxy,
    tools: list[Tool],
    servers_of: dict[str, str],
    log: IO[str],
) -> AsyncIterator[None]:
    """The approval inbox beside the proxy, when the configuration asks for one."""
    if config.inbox is None:
        yield
        return
    from ..inbox import ToolInfo, notify_waiting, parse_listen, read_or_create_token, running_inbox

    settings = config.inbox
    token_file = settings.token_file
    token = read_or_create_token(token_file) if token_file is not None else None
    if config.passkeys is not None:
        from ..passkeys import read_registry
        from ..passkeys._registry import require_webauthn

        require_webauthn()
        read_registry(config.passkeys.registry)  # refused at start, not at the first decision
    described = {
        tool.spec.name: ToolInfo(servers_of.get(tool.spec.name, ""), tool.spec.description)
        for tool in tools
    }
    # A connection of its own: the page's reads never wait on the proxy's lock.
    from ..store import open_store

    with open_store(config.database, create=False) as inbox_store:
        async with running_inbox(
            inbox_store, parse_listen(settings.listen), token=token,
            login=_login_name(), tools=described, passkeys=config.passkeys,
        ) as running:  # fmt: skip
            # The inbox's address joins each approval's line: the call path is built now.
            calls = proxy.call_path().calls
            calls.inbox_address = running.address
            if settings.notify:
                calls.on_waiting = lambda approval: notify_waiting(approval, running.address)
            if token_file is not None:
                log_line(log, f"agentrt proxy: inbox at {running.address} (token in {token_file})")
            else:
                # The only line that carries the token; approvals' lines never do.
                log_line(log, f"agentrt proxy: inbox: {running.address_with_token}")
            try:
                yield
            finally:
                calls.inbox_address = None
                calls.on_waiting = None


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return ""


async def serve_config(
    config: ProxyConfig,
    *,
    http: str | None = None,
    allow_remote: bool = False,
    token: str | None = None,
    log: IO[str] | None = None,
    keep_signals_caught: bool = False,
    stamps: dict[Path, Stamp] | None = None,
) -> int:
    """Serve `config` until the host leaves or a signal arrives; returns the exit status.
    `stamps`: the rules files' stamps as they were when `config` was read."""
    return await _serve(
        config, http=http, allow_remote=allow_remote, token=token, log=log,
        keep_signals_caught=keep_signals_caught, stamps=stamps,
    )  # fmt: skip


async def _serve(
    config: ProxyConfig,
    *,
    http: str | None,
    allow_remote: bool,
    token: str | None,
    log: IO[str] | None,
    keep_signals_caught: bool = False,
    stamps: dict[Path, Stamp] | None = None,
) -> int:
    stream = log if log is not None else sys.stderr
    address: tuple[str, int] | None = None
    listener: socket.socket | None = None
    if http is not None:
        from ._http import is_loopback, listen, split_http

        address = split_http(http)
        if token is not None and config.principals is not None:
            # Two answers to "who is calling": a shared token would stand for no one in
            # particular beside the principals, and pass every rule written for them.
            raise ConfigError(
                f'--token and "principals" in {sanitize(str(config.path))} both say who may '
                "call the proxy; use one (principals for several people, --token for one)"
            )
        if not is_loopback(address[0]) and not (
            allow_remote and (token or config.principals is not None)
        ):
            raise ConfigError(
                f"--http {sanitize(http)} is not a loopback address; serving other hosts "
                'needs --allow-remote and a --token (or "principals")'
            )
        listener = listen(address[0], address[1])
    try:
        return await _serve_config(
            config, address, listener, token, stream, keep_signals_caught=keep_signals_caught,
            stamps=stamps,
        )  # fmt: skip
    finally:
        if listener is not None:
            listener.close()


async def _serve_config(
    config: ProxyConfig,
    address: tuple[str, int] | None,
    listener: socket.socket | None,
    token: str | None,
    stream: IO[str],
    *,
    keep_signals_caught: bool,
    stamps: dict[Path, Stamp] | None,
) -> int:
    shutdown = _Shutdown()
    stopping = shutdown.stopping
    failure: Exception | None = None
    telemetry: TraceExporter | None = None
    store: Store | None = None
    # Caught from here to the end: a signal while calls finish must not kill them.
    async with anyio.create_task_group() as signals:
        signals.start_soon(
            functools.partial(_watch_signals, shutdown, stream, keep_caught=keep_signals_caught)
        )
        try:
            # Here, not at the top: `serve` starts the servers before importing these.
            from ..mcp._spawn import discard_started_early
            from ._offers import Offered
            from ._upstreams import load_upstreams

            servers_of: dict[str, str] = {}
            offered = Offered()
            manifests: dict[str, Manifest] = {}
            waiting: list[UpstreamConfig] = []
            # The servers start first; while they do (a Node server takes a third of a
            # second or more), a worker thread imports what serving needs and opens the
            # store, which used to come before them (issue 36).
            async with anyio.create_task_group() as starting:
                preparing = _Preparing()
                starting.start_soon(preparing.run, config, address is not None)
                await preparing.started.wait()
                try:
                    tools, shutdown.connections = await load_upstreams(
                        config, stream, servers_of, offered, manifests, waiting
                    )
                finally:
                    preparing.loaded()
                    # One started early that no load took (its manifest refused it, say).
                    discard_started_early()
            store = preparing.result()
            telemetry = _start_telemetry(config, tools, stream)
            from ._handlers import Handlers
            from ._proxy import Proxy

            proxy = Proxy(config, store, tools, stream, offered)
            # Over stdio the proxy serves exactly one host: the one principal it may ask.
            proxy.single_host = address is None
            handlers = Handlers(proxy)
            from ._live import LiveListings

            # After the handlers: a server's list_changed is taken before what they forward.
            live = LiveListings(proxy, manifests, stream)
            live.install()
            from ._logins import LoginWatch

            logins = LoginWatch(proxy, waiting, live, shutdown.connections, stream)
            from ._reload import ManifestWatch

            manifest_watch = ManifestWatch(proxy, live, stream)
            from ._rules_reload import RulesWatch

            rules_watch = RulesWatch(proxy, live, stream, stamps)
            from ._checkpointing import checkpointing

            async with (
                checkpointing(store, config.checkpoint, stream),
                running(proxy),
                _serving_inbox(config, proxy, [tool for tool, _ in tools], servers_of, stream),
                _delivering(store, config, stream),
            ):
                assert proxy.work is not None
                proxy.work.start_soon(live.run)
                proxy.work.start_soon(logins.run)
                proxy.work.start_soon(manifest_watch.run)
                proxy.work.start_soon(rules_watch.run)
                if address is not None and listener is not None:
                    from ._http import serve_http
                    from ._http_front import HTTPFront

                    await serve_http(
                        handlers.server(), address[0], address[1], token, stream, stopping,
                        listener, proxy.resource, HTTPFront.of(handlers, stream),
                    )  # fmt: skip
                else:
                    await _serve_stdio(handlers, proxy, stream, stopping)
        except Exception as exc:
            # Re-raised below, outside the task group, so `serve` sees the
            # error itself (a refused database, say) rather than an ExceptionGroup.
            failure = exc
        finally:
            with anyio.CancelScope(shield=True):
                if telemetry is not None:
                    # What was committed before the stop still gets its spans.
                    from anyio import to_thread

                    await to_thread.run_sync(telemetry.stop)
                for connection in shutdown.connections:
                    with contextlib.suppress(Exception):
                        await connection.aclose(polite=not shutdown.hurried)
            if store is not None:
                store.close()
            signals.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return 0


@dataclass
class _Preparing:
    """`_prepare` in a worker thread; its store, or the error that refused it, is kept
    for after the servers have loaded, so a refused database never leaves one loading."""

    store: Store | None = None
    error: BaseException | None = None
    # Set once the thread runs, so the loads begin only then: the thread's imports start
    # before the event loop's own.  (A handshake no longer waits for `mcp_types`, decision
    # 0053; the servers may already be running.)
    started: anyio.Event = field(default_factory=anyio.Event)
    # Over stdio, once the store is open, the thread looks at the host's first message
    # while the servers load (`_peek`), until the loads are done.
    _loaded: threading.Event = field(default_factory=threading.Event)
    _wake: tuple[int, int] | None = None

    async def run(self, config: ProxyConfig, http: bool) -> None:
        # Here, not at the top: imported after the servers are spawned (issue 36).
        from anyio import from_thread, to_thread

        if not http:
            self._wake = os.pipe()

        def work() -> Store:
            from_thread.run_sync(self.started.set)
            if self._wake is None:
                return _prepare(config, http)
            from ._peek import first_bytes, speaks_2026, watch_stdin

            # A host writes its first request as it spawns the proxy: one of the 2026 era
            # has the era's front imported first, the longest of the thread's work.
            waiting = first_bytes(0)
            if waiting is not None and speaks_2026(waiting):
                _import_the_2026_front()
                return _prepare(config, http)
            store = _prepare(config, http)
            if waiting is None:
                watch_stdin(self._loaded, self._wake[0], _import_the_2026_front)
            return store

        try:
            self.store = await to_thread.run_sync(work)
        except Exception as exc:
            self.error = exc
        finally:
            self.started.set()
            if self._wake is not None:
                for descriptor in self._wake:
                    os.close(descriptor)
                self._wake = None

    def loaded(self) -> None:
        """The servers are loaded: the thread stops looking at stdin."""
        self._loaded.set()
        if self._wake is not None:
            with contextlib.suppress(OSError):
                os.write(self._wake[1], b"x")

    def result(self) -> Store:
        if self.error is not None:
            raise self.error
        if self.store is None:
            raise RuntimeError("the proxy's preparation did not finish")
        return self.store


def _delivering(
    store: Store, config: ProxyConfig, stream: IO[str]
) -> contextlib.AbstractAsyncContextManager[object]:
    """The notifications' delivery while serving, when `notify` is configured; its module
    is imported only then."""
    if not config.notify:
        return contextlib.nullcontext()
    from ._notify import delivering

    return delivering(store, config.notify, stream)


def _start_telemetry(
    config: ProxyConfig, tools: list[tuple[Tool, Any]], stream: IO[str]
) -> TraceExporter | None:
    """The span exporter, when an OTLP endpoint is configured (here or in the
    environment); the OpenTelemetry SDK is imported only then."""
    from ..telemetry import settings_from

    settings = settings_from(
        {"otlp_endpoint": config.telemetry.otlp_endpoint, "content": config.telemetry.content},
        default_service="agentrt-proxy",
    )
    if settings is None:
        return None  # off: the exporter and what it follows the store with stay unimported
    from ..telemetry import start_exporter

    return start_exporter(
        config.database,
        settings,
        side_effects={tool.spec.name: str(tool.spec.side_effect) for tool, _ in tools},
        log=stream,
    )


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop, which the proxy runs on wherever it is installed (a core
    dependency on every platform but Windows): 8 % fewer instructions per proxied call
    than on the standard library's (decision 0023).  None, the standard library's, elsewhere."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
