"""The host side of the 2026-07-28 revision: routing headers held to the body.

A real `agentrt proxy --http` in front of the small upstream server; hosts are
httpx2 by hand so a header can disagree with the body on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.subscriptions import ResourceUpdated
from proxy_helpers import (
    ACCEPT,
    ProxySetup,
    build_setup,
    conformance_config,
    host,
    raw_http_host,
    serving_http,
    sse_data,
    text_of,
    until,
)
from test_proxy_hosts import http_proxy

from agentrt.store import open_store
from agentrt.telemetry import TraceBuilder

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow]

MODERN = "2026-07-28"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
}


def _answer(response: httpx2.Response) -> dict[str, object]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return sse_data(response.text.splitlines())[-1]
    return dict(response.json())


def _chain_verifies(setup: ProxySetup) -> None:
    with open_store(setup.database, create=False) as store:
        store.verify_chain()


async def test_a_2025_call_whose_mcp_name_header_disagrees_is_refused_and_nothing_runs(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    async with http_proxy(setup) as url, raw_http_host(url) as raw:
        body = raw.body("tools/call", {"name": "up_write_note", "arguments": {"note": "x"}})
        refused = await raw.client.post(
            url,
            content=body,
            headers=raw.headers(**{"mcp-method": "tools/call", "mcp-name": "up_echo"}),
        )
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == -32020
        assert error["message"] == (
            'the Mcp-Name header "up_echo" does not match the request\'s name '
            '"up_write_note"; nothing was run'
        )
        assert refused.json()["id"] == json.loads(body)["id"]
        # A method header that disagrees is refused the same way.
        lying = await raw.client.post(
            url, content=body, headers=raw.headers(**{"mcp-method": "tools/list"})
        )
        assert lying.status_code == 400
        assert "the Mcp-Method header" in lying.json()["error"]["message"]
        assert setup.executions() == []
        # The same host's honest call still runs.
        honest = await raw.client.post(
            url,
            content=raw.body("tools/call", {"name": "up_echo", "arguments": {"text": "ok"}}),
            headers=raw.headers(**{"mcp-method": "tools/call", "mcp-name": "up_echo"}),
        )
        assert honest.status_code == 200
        assert "ok" in json.dumps(_answer(honest))
    with open_store(setup.database, create=False) as store:
        runs = store.list_runs()
    assert len(runs) == 1  # only the honest call was recorded
    _chain_verifies(setup)


async def test_a_2026_request_whose_headers_disagree_is_a_header_mismatch_error(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    async with http_proxy(setup) as url, httpx2.AsyncClient(timeout=30.0) as client:
        params = {"name": "up_write_note", "arguments": {"note": "x"}, "_meta": ENVELOPE}
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
        headers = {
            "accept": ACCEPT,
            "content-type": "application/json",
            "mcp-protocol-version": MODERN,
            "mcp-method": "tools/call",
        }
        refused = await client.post(url, json=body, headers={**headers, "mcp-name": "up_echo"})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == -32020
        assert refused.json()["id"] == 7
        older = await client.post(
            url, json=body, headers={**headers, "mcp-protocol-version": "2025-11-25",
                                     "mcp-name": "up_write_note"},
        )  # fmt: skip
        # A 2025 version header on a body that names 2026-07-28: the header disagrees.
        assert older.status_code == 400
        assert "MCP-Protocol-Version header" in older.json()["error"]["message"]
        assert setup.executions() == []
        ran = await client.post(url, json=body, headers={**headers, "mcp-name": "up_write_note"})
        assert ran.status_code == 200, ran.text
        await until(lambda: setup.executions("write_note") == ["write_note x"])
        # The lists carry the proxy's own caching promise (decision 0038): none, private.
        listing = {"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": {"_meta": ENVELOPE}}
        listed = await client.post(
            url, json=listing, headers={**headers, "mcp-method": "tools/list"}
        )
        result = _answer(listed)["result"]
        assert isinstance(result, dict)
        assert (result["ttlMs"], result["cacheScope"]) == (0, "private")
    _chain_verifies(setup)


def _client(setup: ProxySetup, **options: Any) -> Client:
    command = setup.command()
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], env=setup.environment(), cwd=str(setup.root)
    )
    return Client(parameters, mode="auto", cache=None, **options)


async def test_a_2026_host_gets_a_servers_log_lines_only_for_a_call_that_asked_in_its_meta(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    asked: list[Any] = []
    unasked: list[Any] = []

    async def on_asked(params: Any) -> None:
        asked.append(params)

    async def on_unasked(params: Any) -> None:
        unasked.append(params)

    with setup.stderr_path.open("a"):
        async with _client(setup, logging_callback=on_unasked) as client:
            silent = await client.call_tool("up_echo", {"text": "log:unasked"})
            assert client.protocol_version == MODERN
        async with _client(setup, logging_callback=on_asked, log_level="warning") as client:
            heard = await client.call_tool("up_echo", {"text": "log:asked"})
    assert silent.is_error is False and heard.is_error is False
    assert unasked == []
    assert [(message.level, message.logger) for message in asked] == [("warning", "upstream")]
    assert "warning log:asked" in asked[0].data


async def test_a_2026_host_listening_is_told_of_a_resource_update_through_its_stream(
    tmp_path: Path,
) -> None:
    log = tmp_path / "conformance.log"
    config = await anyio.to_thread.run_sync(
        lambda: conformance_config(tmp_path, "listen", env=[f"CONFORMANCE_LOG={log}"])
    )
    watched = "test://watched-resource"
    with serving_http(config, tmp_path) as (url, _stderr):
        async with Client(url, mode="auto", cache=None) as client:
            assert client.protocol_version == MODERN
            async with client.listen(resource_subscriptions=[watched]) as stream:
                assert stream.honored.resource_subscriptions == [watched]
                with anyio.fail_after(10):
                    event = await stream.__anext__()
            assert isinstance(event, ResourceUpdated) and event.uri == watched
            # The stream held the server's subscription; once it closed, it was let go.
            await until(lambda: f"resources/unsubscribe {watched}" in log.read_text())
            read = await client.read_resource(watched)
    lines = log.read_text().splitlines()
    assert lines.count(f"resources/subscribe {watched}") == 1
    assert read.contents[0].text == "Watched content."


async def test_a_hosts_traceparent_is_carried_upstream_and_continues_in_the_runs_spans(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with host(setup) as session:
        carried = await session.call_tool(
            "up_echo", {"text": "meta?"}, meta={"traceparent": parent, "tracestate": "k=v"}
        )
        plain = await session.call_tool("up_echo", {"text": "meta?"}, meta={"traceparent": "0"})
    assert json.loads(text_of(carried)) == {"traceparent": parent, "tracestate": "k=v"}
    # A malformed traceparent goes nowhere: neither upstream nor into the run.
    assert json.loads(text_of(plain)) is None
    with open_store(setup.database, create=False) as store:
        events = store.events_after(0, limit=1000)
    builder = TraceBuilder()
    spans = [span for event in events for span in builder.add(event)]
    traced = [span for span in spans if span.trace_id == int(parent.split("-")[1], 16)]
    roots = [span for span in traced if span.parent_span_id == int(parent.split("-")[2], 16)]
    assert roots and all(span.parent_is_remote for span in roots)
    assert any(span.name == "tools/call up_echo" for span in traced)
