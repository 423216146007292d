"""A stdio server started early is sent its connection's `initialize` at once, so that it
boots and answers while the proxy loads (issue 36, decision 0062): the same bytes the
connection would send, sent once, and only where the connection opens with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from servers.harness import stdio_server, wait_until

from agentrt.mcp import _spawn
from agentrt.mcp._connection import connect
from agentrt.mcp._connection_errors import MCPConnectionError, ProtocolViolation
from agentrt.mcp._handshake import initialize_request
from agentrt.mcp._stdio import start_stdio

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def _lines(log: Path) -> list[bytes]:
    return log.read_bytes().splitlines() if log.exists() else []


async def test_a_server_started_early_is_sent_its_handshake_once_and_answers_it(
    tmp_path: Path,
) -> None:
    log = tmp_path / "received.jsonl"
    server = stdio_server({"log": str(log)})
    _spawn.start_early(server)
    try:
        # Before any connection or event loop: the server already has its initialize.
        assert wait_until(lambda: len(_lines(log)) >= 1)
        assert _lines(log) == [initialize_request(server)]
        connection = await connect(server)
        try:
            assert connection.protocol_version is not None
            names = [tool.name for tool in await connection.list_tools()]
            assert names
        finally:
            await connection.aclose()
    finally:
        _spawn.discard_started_early()
    methods = [json.loads(line).get("method") for line in _lines(log)]
    assert methods[:3] == ["initialize", "notifications/initialized", "tools/list"]
    assert methods.count("initialize") == 1
    assert json.loads(_lines(log)[0])["id"] == 1


async def test_a_server_that_probes_first_is_sent_nothing_early(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    server = stdio_server({"log": str(log)}, revision="auto")
    _spawn.start_early(server)
    try:
        spawned = _spawn._STARTED_EARLY[id(server)][1]
        assert spawned.presented is None
        assert not wait_until(lambda: bool(_lines(log)), limit=0.5)
    finally:
        _spawn.discard_started_early()


async def test_a_first_request_that_is_not_the_one_sent_early_is_refused_and_not_sent(
    tmp_path: Path,
) -> None:
    log = tmp_path / "received.jsonl"
    server = stdio_server({"log": str(log)})
    _spawn.start_early(server)
    transport = start_stdio(server)
    try:
        assert transport.presented == initialize_request(server)
        assert wait_until(lambda: len(_lines(log)) == 1)
        with pytest.raises(ProtocolViolation, match="not its connection's first request"):
            await transport.request(1, "tools/list", b'{"jsonrpc":"2.0","id":1,"method":"x"}')
        # The server was told nothing more, and the connection speaks to it no more.
        assert not wait_until(lambda: len(_lines(log)) > 1, limit=0.5)
        with pytest.raises(MCPConnectionError, match="not its connection's first request"):
            await transport.request(2, "ping", b'{"jsonrpc":"2.0","id":2,"method":"ping"}')
    finally:
        await transport.aclose(polite=False)
