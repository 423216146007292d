"""The stdio connection: handshake, listing and calls from raw bytes, over a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import anyio
import pytest
from servers.harness import stdio_server

from agentrt.mcp._connection import RawTool, connect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_connect_lists_and_calls_a_stdio_server(tmp_path: Path) -> None:
    steps: list[str] = []
    connection = await connect(stdio_server(), on_step=steps.append)
    try:
        assert steps == ["starting the server", "performing the handshake"]
        assert connection.protocol_version == "2025-11-25"
        tools = await connection.list_tools()
        assert [tool.name for tool in tools] == ["env", "pid", "echo", "ok"]
        assert isinstance(tools[0], RawTool)
        assert tools[0].raw["inputSchema"] == {"type": "object"}
        result = await connection.call_tool("ok", "{}", timeout=5)
        assert result == {"content": [{"type": "text", "text": "ok"}]}
    finally:
        await connection.aclose()


async def test_handshake_advertises_no_client_capabilities(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    connection = await connect(stdio_server({"log": str(log)}))
    await connection.aclose()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[0]["method"] == "initialize"
    assert lines[0]["params"]["capabilities"] == {}
    assert lines[1] == {"jsonrpc": "2.0", "method": "notifications/initialized"}


async def test_call_arguments_are_sent_as_the_exact_text_given(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    connection = await connect(stdio_server({"log": str(log)}))
    arguments = '{"bound": 9007199254740993, "price": 1.50, "big": 1e400}'
    try:
        await connection.call_tool("ok", arguments, timeout=5)
    finally:
        await connection.aclose()
    sent = log.read_bytes().splitlines()[-1]
    assert b'"arguments":' + arguments.encode() + b"}" in sent


async def test_structured_content_keeps_number_literals() -> None:
    raw = (
        '{"content":[],"structuredContent":{"id":9007199254740993,"price":1.50,'
        '"small":1e-7,"Price":2}}'
    )
    connection = await connect(stdio_server({"calls": {"numbers": {"result": raw}}}))
    try:
        result = await connection.call_tool("numbers", "{}", timeout=5)
    finally:
        await connection.aclose()
    structured = result["structuredContent"]
    assert structured["id"] == 9007199254740993 and type(structured["id"]) is int
    assert str(structured["price"]) == "1.50" and isinstance(structured["price"], Decimal)
    assert structured["Price"] == 2  # keys are exact: "price" and "Price" are two members


async def test_a_200_kb_result_arrives_whole() -> None:
    connection = await connect(stdio_server({"calls": {"big": {"text_of_size": 200_000}}}))
    try:
        result = await connection.call_tool("big", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert result["content"][0]["text"] == "x" * 200_000


async def test_several_calls_in_flight_are_matched_by_id() -> None:
    calls = {
        f"slow{index}": {"sleep": 0.3 - index * 0.1, "result": json.dumps({"n": index})}
        for index in range(3)
    }
    connection = await connect(stdio_server({"calls": calls}))
    results: dict[str, object] = {}

    async def call(name: str) -> None:
        results[name] = await connection.call_tool(name, "{}", timeout=5)

    try:
        async with anyio.create_task_group() as group:
            for name in calls:
                group.start_soon(call, name)
    finally:
        await connection.aclose()
    assert results == {f"slow{index}": {"n": index} for index in range(3)}


def test_the_handshake_versions_are_the_sdks() -> None:
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

    from agentrt.mcp import _handshake

    assert _handshake.HANDSHAKE_PROTOCOL_VERSIONS == HANDSHAKE_PROTOCOL_VERSIONS
    assert _handshake.LATEST_HANDSHAKE_VERSION == LATEST_HANDSHAKE_VERSION


_WITHOUT_THE_SDKS_MODELS = """
import json, sys
import anyio
from servers.harness import stdio_server
from agentrt.mcp._connection import connect

async def main():
    connection = await connect(stdio_server())
    try:
        await connection.list_tools()
        await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()

anyio.run(main)
print(json.dumps(sorted(m for m in ("mcp_types", "pydantic", "mcp") if m in sys.modules)))
"""


def test_a_stdio_connection_never_waits_for_the_sdks_models() -> None:
    # The proxy builds `mcp_types`' models in a worker thread while its servers start
    # (decision 0026): a handshake that imported them would wait for that thread (issue 36).
    finished = subprocess.run(
        [sys.executable, "-c", _WITHOUT_THE_SDKS_MODELS],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout.strip().splitlines()[-1]) == []
