"""The connection against the stock servers from npm and PyPI, over real stdio."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from agentrt.mcp._connection import connect
from agentrt.mcp._server import Server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

_NPM = Path(__file__).parents[1] / "npm" / "node_modules" / "@modelcontextprotocol"
_EVERYTHING = _NPM / "server-everything" / "dist" / "index.js"
_FILESYSTEM = _NPM / "server-filesystem" / "dist" / "index.js"
_NODE = shutil.which("node")

needs_node = pytest.mark.skipif(
    _NODE is None or not _EVERYTHING.exists(), reason="node and the npm test servers are needed"
)


@needs_node
async def test_everything_server_lists_calls_and_sees_only_the_exact_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-operator-secret")
    monkeypatch.setenv("AGENTRT_TEST_TOKEN", "for-the-server")
    assert _NODE is not None
    server = Server(
        name="everything",
        command=[_NODE, str(_EVERYTHING), "stdio"],
        inherit_env=["AGENTRT_TEST_TOKEN"],
    )
    connection = await connect(server)
    try:
        names = [tool.name for tool in await connection.list_tools()]
        assert {"echo", "get-env", "get-sum"} <= set(names)
        echoed = await connection.call_tool("echo", '{"message": "hello"}', timeout=10)
        assert echoed["content"][0]["text"] == "Echo: hello"
        environment_result = await connection.call_tool("get-env", "{}", timeout=10)
    finally:
        await connection.aclose()
    environment = json.loads(environment_result["content"][0]["text"])
    assert "ANTHROPIC_API_KEY" not in environment
    assert environment["AGENTRT_TEST_TOKEN"] == "for-the-server"
    expected = {"PATH", "HOME", "TMPDIR", "AGENTRT_TEST_TOKEN"} & set(os.environ)
    assert set(environment) == expected


@needs_node
async def test_filesystem_server_reads_a_file(tmp_path: Path) -> None:
    assert _NODE is not None
    (tmp_path / "note.txt").write_text("remember the milk")
    server = Server(name="fs", command=[_NODE, str(_FILESYSTEM), str(tmp_path)])
    connection = await connect(server)
    try:
        tools = {tool.name: tool for tool in await connection.list_tools()}
        assert len(tools) == 14
        assert tools["read_text_file"].raw["annotations"]["readOnlyHint"] is True
        arguments = json.dumps({"path": str(tmp_path / "note.txt")})
        result = await connection.call_tool("read_text_file", arguments, timeout=10)
    finally:
        await connection.aclose()
    assert result["content"][0]["text"] == "remember the milk"


async def test_time_server_from_pypi_answers() -> None:
    server = Server(name="time", command=[sys.executable, "-m", "mcp_server_time"])
    connection = await connect(server)
    try:
        names = [tool.name for tool in await connection.list_tools()]
        result = await connection.call_tool("get_current_time", '{"timezone": "UTC"}', timeout=10)
    finally:
        await connection.aclose()
    assert names == ["get_current_time", "convert_time"]
    assert json.loads(result["content"][0]["text"])["timezone"] == "UTC"
