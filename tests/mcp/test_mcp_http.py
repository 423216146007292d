"""Pin, load and call over streamable HTTP: the SDK's own server under uvicorn on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrt import SideEffect, ToolCall
from agentrt.mcp import Rule, Server, load, pin

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SDK_HTTP = Path(__file__).parent / "servers" / "sdk_http.py"


@pytest.fixture(params=[[], ["--json"]], ids=["sse", "json"])
def endpoint(request: pytest.FixtureRequest) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(SDK_HTTP), *request.param],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


async def test_a_streamable_http_server_pins_loads_and_calls(endpoint: str) -> None:
    server = Server(name="calc", endpoint=endpoint, default_timeout=10.0)
    manifest = await pin(server)
    assert sorted(manifest.tools) == ["add", "ask", "slow"]
    tools, report = await load(server, manifest, {"add": Rule(side_effect=SideEffect.READ_ONLY)})
    try:
        assert report.unclassified == ["ask", "slow"]
        (add,) = tools
        result = await add.call(ToolCall(args='{"a": 2, "b": 3}'))
        assert result.content == '{"sum":5}'
        assert result.summary == "calc/add: 9 bytes"
    finally:
        assert report.connection is not None
        await report.connection.aclose()
