"""The revision's `HeaderMismatchError` (-32020, HTTP 400): a call the server refused before
running it, for headers that disagree with its body, is retried ONCE after the tools are
listed again (spec 2026-07-28, "Custom Headers from Tool Parameters"; the official
TypeScript client does the same), only when the refusal proves nothing ran, and held to
the pins through the proxy's `Upstream`.

Servers: the official SDK's modern stateless server (`servers/sdk_revision.py`, whose
"reheader" moves the region argument to another header) and a scripted one that answers
HeaderMismatch forever (`servers/hostile_http.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from servers.harness import hostile_http, http_server

from agentrt import ToolCall
from agentrt.mcp import Rule, Server, ServerToolError, load, pin
from agentrt.mcp._connection import HeaderMismatchRefused, ServerErrorResponse, connect
from agentrt.mcp._revision import MODERN_REVISION
from agentrt.tools import SideEffect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SDK_REVISION = Path(__file__).parent / "servers" / "sdk_revision.py"
MISMATCH = '{"jsonrpc":"2.0","id":{id},"error":{"code":-32020,"message":"Mcp-Param-X disagrees"}}'
_DISCOVERED = json.dumps(
    {"supportedVersions": [MODERN_REVISION], "capabilities": {"tools": {}}, "_meta": {}}
)
_TOOLS = json.dumps(
    {
        "tools": [
            {"name": "stuck", "inputSchema": {"type": "object"}},
            {"name": "ok", "inputSchema": {"type": "object"}},
        ]
    }
)


def _received(log: Path, method: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    bodies = [json.loads(line["body"]) for line in lines if line.get("body")]
    return [body for body in bodies if body.get("method") == method]


async def test_a_call_refused_for_a_changed_header_parameter_is_retried_once_after_relisting() -> (
    None
):
    with http_server(SDK_REVISION, "http", "--stateless") as url:
        connection = await connect(Server(name="remote", endpoint=url, revision="auto"))
        try:
            await connection.list_tools()
            moved = await connection.call_tool("reheader", "{}", timeout=10)
            assert moved["content"][0]["text"] == "the region goes in Mcp-Param-Zone now"
            # The client still mirrors the region into Mcp-Param-Region: the server refuses
            # it before running it; listed again, the call goes with Mcp-Param-Zone.
            told: list[str] = []
            result = await connection.call_tool_checked(
                "region", '{"region":"eu","query":"q"}', timeout=10, on_retry=told.append
            )
            again = await connection.call_tool_checked(
                "region", '{"region":"us","query":"r"}', timeout=10, on_retry=told.append
            )
        finally:
            await connection.aclose()
    assert result["content"][0]["text"] == "ran q in eu"
    assert again["content"][0]["text"] == "ran r in us"
    assert told == [
        'server "remote" refused tools/call for "region" because its headers disagreed with '
        "its body (HeaderMismatch), before running it; its tools were listed again and the "
        "call was sent once more"
    ]


async def test_a_server_that_answers_header_mismatch_forever_gets_one_retry_then_one_sentence(
    tmp_path: Path,
) -> None:
    log = tmp_path / "received.jsonl"
    scenario = {
        "log": str(log),
        "pages": {"": _TOOLS},
        "methods": {"server/discover": _DISCOVERED},
        "calls": {"ok": {"result": '{"content":[{"type":"text","text":"fine"}]}'}},
        "http_error": {"stuck": {"status": 400, "body": MISMATCH}},
    }
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url, revision="auto"))
        try:
            await connection.list_tools()
            with pytest.raises(HeaderMismatchRefused) as refused:
                await connection.call_tool("stuck", "{}", timeout=10)
            fine = await connection.call_tool("ok", "{}", timeout=10)
        finally:
            await connection.aclose()
    assert str(refused.value) == (
        'server "remote" refused tools/call for "stuck" twice because its headers disagree '
        "with its body (HeaderMismatch), also after its tools were listed again; nothing ran"
    )
    assert refused.value.code == -32020
    assert fine["content"][0]["text"] == "fine"
    calls = [body["params"]["name"] for body in _received(log, "tools/call")]
    assert calls == ["stuck", "stuck", "ok"]  # one retry, never more
    assert len(_received(log, "tools/list")) == 2  # the first listing, and one to retry


async def test_a_header_mismatch_in_a_200_body_proves_nothing_and_is_not_retried(
    tmp_path: Path,
) -> None:
    log = tmp_path / "received.jsonl"
    scenario = {
        "log": str(log),
        "pages": {"": _TOOLS},
        "methods": {"server/discover": _DISCOVERED},
        "http_error": {"stuck": {"status": 200, "body": MISMATCH}},
    }
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url, revision="auto"))
        try:
            await connection.list_tools()
            with pytest.raises(ServerErrorResponse) as refused:
                await connection.call_tool("stuck", "{}", timeout=10)
        finally:
            await connection.aclose()
    assert not isinstance(refused.value, HeaderMismatchRefused)
    assert refused.value.code == -32020
    assert [body["params"]["name"] for body in _received(log, "tools/call")] == ["stuck"]


async def test_through_the_pins_a_tool_whose_header_parameter_changed_is_refused_not_retried(
    tmp_path: Path,
) -> None:
    with http_server(SDK_REVISION, "http", "--stateless") as url:
        server = Server(name="sdk", endpoint=url, revision="auto", default_timeout=10)
        manifest = await pin(server)
        rules = {
            "region": Rule(side_effect=SideEffect.READ_ONLY),
            "reheader": Rule(side_effect=SideEffect.READ_ONLY),
        }
        tools, report = await load(server, manifest, rules)
        assert report.connection is not None
        try:
            by_name = {tool.server_tool_name: tool for tool in tools}
            ran = await by_name["region"].call(
                ToolCall(run_id="r1", tool="sdk_region", args='{"region":"eu","query":"q"}')
            )
            await by_name["reheader"].call(ToolCall(run_id="r1", tool="sdk_reheader", args="{}"))
            with pytest.raises(ServerToolError) as refused:
                await by_name["region"].call(
                    ToolCall(run_id="r1", tool="sdk_region", args='{"region":"eu","query":"q"}')
                )
            upstream = by_name["region"].upstream
        finally:
            await report.connection.aclose()
    assert "ran q in eu" in ran.content
    message = str(refused.value)
    assert message.startswith(
        'server "sdk" tool "region" failed: server "sdk" refused tools/call for "region" '
        "because its headers disagree with its body (HeaderMismatch), and listed again the "
        "tool is refused: "
    ), message
    assert message.endswith("; nothing ran")
    assert refused.value.outcome_known
    assert upstream.refusal("region")  # withheld until the operator pins it again
    assert upstream.refusal("reheader") == ""


async def test_through_the_pins_a_call_retried_after_relisting_says_so_in_its_record() -> None:
    with http_server(SDK_REVISION, "http", "--stateless") as url:
        server = Server(name="sdk", endpoint=url, revision="auto", default_timeout=10)
        manifest = await pin(server)
        tools, report = await load(
            server, manifest, {"region": Rule(side_effect=SideEffect.READ_ONLY)}
        )
        assert report.connection is not None
        try:
            # As if the annotation had not been read: the header goes missing, the server
            # refuses before running, the tools are listed again (unchanged: the pin
            # holds) and the call is sent once more.
            report.connection._header_maps.clear()
            ran = await tools[0].call(
                ToolCall(run_id="r1", tool="sdk_region", args='{"region":"eu","query":"q"}')
            )
        finally:
            await report.connection.aclose()
    assert "ran q in eu" in ran.content
    assert ran.summary.endswith(
        '; server "sdk" refused tools/call for "region" because its headers disagreed with '
        "its body (HeaderMismatch), before running it; its tools were listed again and the "
        "call was sent once more"
    ), ran.summary
