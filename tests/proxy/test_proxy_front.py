"""The stdio front (`proxy/_dispatch.py`, decision 0043): the methods every host sends are
answered without the MCP SDK's server, as that server answers them; anything else loads
the SDK's server behind the front, which then answers it, and the calls go on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from proxy_helpers import ProxySetup, RawHost, build_setup

from agentrt.proxy._dispatch import WIRE_REQUESTS, WIRE_RESULTS, initialize_answer
from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

_LOADED = "loading the MCP SDK's server"


def _sdk_server() -> Any:
    from agentrt.proxy._handlers import Handlers

    proxy = SimpleNamespace(offered=SimpleNamespace(tools={}), listeners=SimpleNamespace())
    handlers = Handlers(proxy)  # type: ignore[arg-type]
    return handlers.server()


@pytest.mark.parametrize("requested", ["2025-06-18", "2025-11-25", "2024-11-05", "1999-01-01"])
def test_the_fronts_initialize_answer_is_the_sdk_servers(requested: str) -> None:
    from mcp.server.connection import Connection
    from mcp.server.runner import ServerRunner

    params = {
        "protocolVersion": requested,
        "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "a-host", "version": "1"},
    }
    connection = Connection.for_loop(None)  # type: ignore[arg-type]
    from agentrt.proxy._live import initialization_options

    server = _sdk_server()
    # As the proxy runs it: saying its lists may change while it serves (`_live.py`).
    runner = ServerRunner(server, connection, None, init_options=initialization_options(server))
    starting = connection.protocol_version
    sdk = runner._serialize("initialize", starting, runner._handle_initialize(params))
    client, version, front = initialize_answer(params)
    assert json.dumps(front) == json.dumps(sdk)  # the same keys in the same order
    assert (client, version) == runner._negotiate_initialize(params)


def test_the_front_checks_and_shapes_with_the_types_the_sdk_maps_each_handshake_version_to() -> (
    None
):
    from mcp_types import methods
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    for version in HANDSHAKE_PROTOCOL_VERSIONS:
        for method in WIRE_REQUESTS:
            assert methods.CLIENT_REQUESTS[(method, version)] is WIRE_REQUESTS[method]
            assert methods.SERVER_RESULTS[(method, version)] is WIRE_RESULTS[method]


class _Lines:
    """Every line a proxy writes, in order, read as JSON."""

    def __init__(self, host: RawHost) -> None:
        self._reader: BufferedByteReceiveStream = host._reader
        self.seen: list[dict[str, Any]] = []

    async def answer(self, request_id: int | str) -> dict[str, Any]:
        with anyio.fail_after(30):
            while True:
                message = json.loads(await self._reader.receive_until(b"\n", 1 << 22))
                self.seen.append(message)
                if message.get("id") == request_id and "method" not in message:
                    return dict(message)


async def _ask(host: RawHost, lines: _Lines, method: str, params: dict[str, Any]) -> Any:
    return await lines.answer(await host.send_request(method, params))


async def test_bad_params_are_refused_with_the_sdks_codes_and_the_proxy_serves_on(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    async with RawHost.start(setup) as host:
        lines = _Lines(host)
        nameless = await _ask(host, lines, "tools/call", {"arguments": {"text": "x"}})
        bad_cursor = await _ask(host, lines, "tools/list", {"cursor": 5})
        echoed = await _ask(
            host, lines, "tools/call", {"name": "up_echo", "arguments": {"text": "on"}}
        )
        unknown = await _ask(host, lines, "no/such/method", {})
    invalid = {"code": -32602, "message": "Invalid request parameters", "data": ""}
    assert nameless["error"] == invalid
    assert bad_cursor["error"] == invalid
    assert echoed["result"]["content"][0]["text"] == "on"
    assert unknown["error"] == {
        "code": -32601,
        "message": "Method not found",
        "data": "no/such/method",
    }
    with open_store(setup.database, read_only=True) as store:
        assert len(store.list_runs(limit=100)) == 1  # the refused requests made no run
    # Only the unknown method needed the SDK's server.
    assert setup.stderr().count(_LOADED) == 1


async def test_a_method_the_front_does_not_answer_loads_the_sdks_server_behind_it(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    async with RawHost.start(setup) as host:
        lines = _Lines(host)
        listed = await _ask(host, lines, "tools/list", {})
        first = await _ask(
            host, lines, "tools/call", {"name": "up_echo", "arguments": {"text": "1"}}
        )
        assert _LOADED not in setup.stderr()
        # logging/setLevel is the SDK's server's: it is loaded, told the host's initialize
        # again, and answers; the front's calls go on beside it.
        level = await _ask(host, lines, "logging/setLevel", {"level": "warning"})
        second = await _ask(
            host, lines, "tools/call", {"name": "up_echo", "arguments": {"text": "2"}}
        )
        relisted = await _ask(host, lines, "tools/list", {})
    assert level["result"] == {}
    assert [first["result"]["content"][0]["text"], second["result"]["content"][0]["text"]] == [
        "1",
        "2",
    ]
    assert relisted["result"] == listed["result"]
    assert setup.stderr().count(_LOADED) == 1
    # The SDK's answer to the initialize it was told again never reaches the host.
    assert [message for message in lines.seen if isinstance(message.get("id"), str)] == []


@asynccontextmanager
async def _bare_process(setup: ProxySetup) -> AsyncIterator[RawHost]:
    """A proxy process no handshake was sent to yet."""
    with setup.stderr_path.open("a") as errlog:
        process = await anyio.open_process(
            setup.command(), stderr=errlog, env=setup.environment(), cwd=str(setup.root)
        )
        try:
            yield RawHost(process, errlog)
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()


async def test_a_request_before_the_handshake_is_the_sdks_to_answer_and_the_host_goes_on(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    async with _bare_process(setup) as host:
        lines = _Lines(host)
        early = await _ask(host, lines, "tools/list", {})
        hello = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "late", "version": "0"},
        }
        initialized = await _ask(host, lines, "initialize", hello)
        await host.notify("notifications/initialized", {})
        echoed = await _ask(
            host, lines, "tools/call", {"name": "up_echo", "arguments": {"text": "late"}}
        )
    assert early["error"] == {"code": -32602, "message": "Invalid request parameters", "data": ""}
    assert initialized["result"]["serverInfo"]["name"] == "agentrt-proxy"
    assert echoed["result"]["content"][0]["text"] == "late"
    assert setup.stderr().count(_LOADED) == 1
