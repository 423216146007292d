"""DNS rebinding: on every loopback bind, a request must name the listener in Host and
(when it has one) Origin; the listener still serves its real host."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from proxy_helpers import build_setup, text_of, until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

_INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "rebinding-probe", "version": "0"},
        },
    }
)
_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _free_port(address: str) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.mark.parametrize("bound", ["127.0.0.2", "127.1.2.3", "[::1]", "[0:0:0:0:0:0:0:1]"])
async def test_a_loopback_bind_refuses_a_foreign_host_or_origin_and_serves_its_own(
    tmp_path: Path, bound: str
) -> None:
    setup = await build_setup(tmp_path)
    address = bound.strip("[]")
    port = _free_port(address)
    url = f"http://{bound}:{port}/mcp"
    with setup.stderr_path.open("a") as errlog:
        process = await anyio.open_process(
            [*setup.command(), "--http", f"{bound}:{port}"],
            stderr=errlog, env=setup.environment(), cwd=str(setup.root),
        )  # fmt: skip
        try:
            await until(lambda: _listening(address, port), 30)
            async with httpx2.AsyncClient(timeout=30) as client:

                async def probe(**headers: str) -> int:
                    response = await client.post(
                        url, content=_INITIALIZE, headers={**_HEADERS, **headers}
                    )
                    return int(response.status_code)

                foreign_host = await probe(Host="attacker.example")
                foreign_host_port = await probe(Host=f"attacker.example:{port}")
                other_port = await probe(Host=f"localhost:{port + 1}")
                foreign_origin = await probe(Origin="http://attacker.example")
                null_origin = await probe(Origin="null")
                as_localhost = await probe(
                    Host=f"localhost:{port}", Origin=f"http://localhost:{port}"
                )
                as_bound = await probe(Host=f"{bound}:{port}", Origin=f"http://{bound}:{port}")
            async with (
                streamable_http_client(url) as (read_stream, write_stream),
                ClientSession(read_stream, write_stream) as session,
            ):
                await session.initialize()
                echo = await session.call_tool("up_echo", {"text": "own host"})
        finally:
            process.terminate()
            with anyio.fail_after(20):
                await process.wait()
    assert (foreign_host, foreign_host_port, other_port) == (421, 421, 421)
    assert (foreign_origin, null_origin) == (403, 403)
    assert (as_localhost, as_bound) == (200, 200)
    assert text_of(echo) == "own host"
    assert "refused an HTTP request whose Host" in setup.stderr()
    assert setup.executions() == []
