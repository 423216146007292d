"""The streamable HTTP connection, against the SDK's real server and a hostile one, on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from servers.harness import SDK_HTTP, hostile_http, http_server

from agentrt.mcp._connection import connect
from agentrt.mcp._connection_errors import (
    CallTimeout,
    ConnectionClosed,
    MCPConnectionError,
    NotSent,
    ProtocolViolation,
    ServerErrorResponse,
)
from agentrt.mcp._http import MAX_RESPONSE_BODY_BYTES
from agentrt.mcp._server import Server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture(scope="module", params=["sse", "json"])
def sdk_endpoint(request: pytest.FixtureRequest) -> Iterator[str]:
    arguments = ["--json"] if request.param == "json" else []
    with http_server(SDK_HTTP, *arguments) as url:
        yield url


def _requests(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


async def test_sdk_http_server_lists_and_calls(sdk_endpoint: str) -> None:
    connection = await connect(Server(name="sdk", endpoint=sdk_endpoint))
    try:
        tools = await connection.list_tools()
        assert [tool.name for tool in tools] == ["add", "ask", "slow"]
        result = await connection.call_tool("add", '{"a": 2, "b": 3}', timeout=10)
        assert result["structuredContent"] == {"sum": 5}
        assert result["content"][0]["text"] == "5"
    finally:
        await connection.aclose()


async def test_sdk_http_elicitation_is_refused_and_the_call_completes(sdk_endpoint: str) -> None:
    connection = await connect(Server(name="sdk", endpoint=sdk_endpoint))
    try:
        result = await connection.call_tool("ask", "{}", timeout=10)
    finally:
        await connection.aclose()
    text = result["content"][0]["text"]
    assert text.startswith("elicitation refused")


async def test_sdk_http_calls_in_flight_at_once(sdk_endpoint: str) -> None:
    connection = await connect(Server(name="sdk", endpoint=sdk_endpoint))
    results: list[str] = []

    async def call(seconds: str) -> None:
        result = await connection.call_tool("slow", f'{{"seconds": {seconds}}}', timeout=10)
        results.append(result["content"][0]["text"])

    try:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                for _ in range(3):
                    group.start_soon(call, "0.5")
    finally:
        await connection.aclose()
    assert results == ["slept"] * 3


async def test_http_close_during_an_in_flight_call_fails_it_cleanly(sdk_endpoint: str) -> None:
    connection = await connect(Server(name="sdk", endpoint=sdk_endpoint))
    errors: list[BaseException] = []

    async def call() -> None:
        try:
            await connection.call_tool("slow", '{"seconds": 30}', timeout=60)
        except ConnectionClosed as exc:
            errors.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await anyio.sleep(0.3)
            async with anyio.create_task_group() as closers:
                for _ in range(3):
                    closers.start_soon(connection.aclose)
    assert len(errors) == 1


async def test_session_id_and_protocol_version_are_sent_back_and_the_session_deleted(
    tmp_path: Path,
) -> None:
    log = tmp_path / "requests.jsonl"
    with hostile_http({"log": str(log)}) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        await connection.list_tools()
        await connection.aclose()
        requests = _requests(log)
    initialize, initialized, listing, delete = requests
    assert "mcp-session-id" not in initialize["headers"]
    assert initialize["headers"]["accept"] == "application/json, text/event-stream"
    assert json.loads(initialize["body"])["params"]["capabilities"] == {}
    for later in (initialized, listing, delete):
        assert later["headers"]["mcp-session-id"] == "session-7f3a"
        assert later["headers"]["mcp-protocol-version"] == "2025-11-25"
    assert json.loads(initialized["body"])["method"] == "notifications/initialized"
    assert delete["method"] == "DELETE"


async def test_http_results_keep_number_literals_from_json_and_sse(tmp_path: Path) -> None:
    raw = '{"content":[],"structuredContent":{"id":9007199254740993,"price":1.50}}'
    for mode in ("json", "sse"):
        with hostile_http({"mode": mode, "calls": {"n": {"result": raw}}}) as url:
            connection = await connect(Server(name="remote", endpoint=url))
            try:
                result = await connection.call_tool("n", "{}", timeout=10)
            finally:
                await connection.aclose()
        structured = result["structuredContent"]
        assert type(structured["id"]) is int and structured["id"] == 9007199254740993
        assert isinstance(structured["price"], Decimal) and str(structured["price"]) == "1.50"


async def test_http_sse_elicitation_is_answered_with_an_error(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    scenario = {"mode": "sse", "log": str(log), "calls": {"ask": {"elicit": True}}}
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            result = await connection.call_tool("ask", "{}", timeout=10)
        finally:
            await connection.aclose()
        answers = [
            json.loads(entry["body"]) for entry in _requests(log) if "elicit-1" in entry["body"]
        ]
    assert result["content"][0]["text"] == "elicitation answered with error -32601"
    assert answers[0]["error"]["code"] == -32601


async def test_http_sse_noise_before_the_answer_is_ignored() -> None:
    before = [
        "not json at all",
        '{"jsonrpc":"2.0","method":"notifications/progress","params":{}}',
        '{"jsonrpc":"2.0","id":"{id}","result":{"wrong":"id"}}',
    ]
    # An answer in an event that is not a "message" event is not an answer.
    other_event = 'event: other\ndata: {"jsonrpc":"2.0","id":{id},"result":{"wrong":1}}\n\n'
    # An event cut off by a blank line inside "data" is two events, neither ours.
    cr_lines = "data: {\r\rdata: }\r\r"
    spec = {"before": before, "before_raw": [other_event, cr_lines]}
    with hostile_http({"mode": "sse", "calls": {"ok": spec}}) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            result = await connection.call_tool("ok", "{}", timeout=10)
        finally:
            await connection.aclose()
    assert result == {"content": [{"type": "text", "text": "ok"}]}


async def test_http_sse_stream_ending_without_an_answer_fails_the_call() -> None:
    with hostile_http({"mode": "sse", "calls": {"gone": {"end_without_answer": True}}}) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            with pytest.raises(ProtocolViolation) as caught:
                await connection.call_tool("gone", "{}", timeout=10)
        finally:
            await connection.aclose()
    assert "ended its event stream without answering tools/call" in str(caught.value)


async def test_http_redirect_is_not_followed(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with hostile_http({"redirect": "/elsewhere", "log": str(log)}) as url:
        with pytest.raises(ProtocolViolation) as caught:
            await connect(Server(name="remote", endpoint=url))
        paths = [entry["path"] for entry in _requests(log)]
    assert paths == ["/mcp"]  # nothing was sent where the redirect pointed
    message = str(caught.value)
    assert message.startswith(
        'server "remote" answered initialize with a redirect to http://127.0.0.1:'
    )
    assert "/elsewhere, which is not followed" in message


async def test_http_redirect_is_followed_when_the_callers_client_says_so(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with hostile_http({"redirect": "/elsewhere", "log": str(log)}) as url:
        server = Server(
            name="remote",
            endpoint=url,
            http_client_factory=lambda: httpx2.AsyncClient(follow_redirects=True),
        )
        connection = await connect(server)
        await connection.aclose()
        paths = [entry["path"] for entry in _requests(log)]
    assert paths[:2] == ["/mcp", "/elsewhere"]


async def test_http_client_factory_settings_are_used(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with hostile_http({"log": str(log)}) as url:
        server = Server(
            name="remote",
            endpoint=url,
            http_client_factory=lambda: httpx2.AsyncClient(
                headers={"authorization": "Bearer for-this-server"}
            ),
        )
        connection = await connect(server)
        await connection.aclose()
        requests = _requests(log)
    assert all(entry["headers"]["authorization"] == "Bearer for-this-server" for entry in requests)


async def test_http_client_factory_returning_something_else_is_an_error() -> None:
    server = Server(name="remote", endpoint="http://127.0.0.1:9/mcp", http_client_factory=dict)
    with pytest.raises(MCPConnectionError) as caught:
        await connect(server)
    assert str(caught.value) == (
        'server "remote": http_client_factory returned dict, not an httpx2.AsyncClient'
    )


@pytest.mark.parametrize("declared", [False, True])
async def test_http_body_over_the_cap_fails_the_read(declared: bool) -> None:
    scenario = {"oversize": "big", "declared": declared}
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            with anyio.fail_after(20), pytest.raises(ProtocolViolation) as caught:
                await connection.call_tool("big", "{}", timeout=20)
            # The session survives a refused body.
            assert await connection.call_tool("ok", "{}", timeout=10)
        finally:
            await connection.aclose()
    assert str(caught.value) == (
        f'server "remote" sent a response body over {MAX_RESPONSE_BODY_BYTES} bytes, '
        "so the read failed"
    )


async def test_http_sse_body_over_the_cap_fails_the_read() -> None:
    with hostile_http({"oversize": "tools/call", "mode": "sse"}) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            with anyio.fail_after(20), pytest.raises(ProtocolViolation):
                await connection.call_tool("ok", "{}", timeout=20)
        finally:
            await connection.aclose()


async def test_an_unreachable_endpoint_is_an_error_naming_the_server() -> None:
    with pytest.raises(MCPConnectionError) as caught:
        await connect(Server(name="remote", endpoint="http://127.0.0.1:9/mcp"))
    assert str(caught.value).startswith('server "remote" could not be reached for initialize:')


async def test_http_call_never_answered_times_out_and_posts_cancelled(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with hostile_http({"log": str(log), "calls": {"hang": {"never": True}}}) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            with pytest.raises(CallTimeout):
                await connection.call_tool("hang", "{}", timeout=0.3)
            assert await connection.call_tool("ok", "{}", timeout=10)
        finally:
            await connection.aclose()
        bodies = [json.loads(entry["body"]) for entry in _requests(log) if entry["body"]]
    call = next(body for body in bodies if body.get("params", {}).get("name") == "hang")
    cancelled = [body for body in bodies if body.get("method") == "notifications/cancelled"]
    assert [body["params"]["requestId"] for body in cancelled] == [call["id"]]


async def test_http_jsonrpc_error_in_a_4xx_body_is_the_servers_error() -> None:
    body = '{"jsonrpc":"2.0","id":null,"error":{"code":-32602,"message":"bad \\u001b[31margs"}}'
    scenario = {"http_error": {"picky": {"status": 400, "body": body}}}
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            with pytest.raises(ServerErrorResponse) as caught:
                await connection.call_tool("picky", "{}", timeout=10)
        finally:
            await connection.aclose()
    assert str(caught.value) == (
        'server "remote" answered tools/call with error -32602: bad \\x1b[31margs'
    )


async def test_http_error_status_without_a_jsonrpc_error_names_the_status() -> None:
    scenario = {"http_error": {"broken": {"status": 500, "body": "<html>oops</html>"}}}
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            with pytest.raises(ProtocolViolation) as caught:
                await connection.call_tool("broken", "{}", timeout=10)
        finally:
            await connection.aclose()
    assert str(caught.value) == 'server "remote" answered tools/call with HTTP 500'


async def test_http_404_after_the_session_began_closes_it() -> None:
    scenario = {"http_error": {"tools/list": {"status": 404, "body": "gone"}}}
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            with pytest.raises(ConnectionClosed) as caught:
                await connection.list_tools()
        finally:
            await connection.aclose()
    assert str(caught.value) == 'server "remote" no longer knows this session (HTTP 404)'


async def test_http_client_factory_handing_out_one_client_twice_is_refused() -> None:
    shared = httpx2.AsyncClient()
    with hostile_http() as url:
        server = Server(name="remote", endpoint=url, http_client_factory=lambda: shared)
        first = await connect(server)
        try:
            with pytest.raises(MCPConnectionError) as caught:
                await connect(server)
            assert await first.call_tool("ok", "{}", timeout=10)  # the first is unharmed
        finally:
            await first.aclose()
        # Once the first connection closed it, the shared client is closed: refused too.
        with pytest.raises(MCPConnectionError):
            await connect(server)
    assert str(caught.value) == (
        'server "remote": http_client_factory returned a client that is closed or in use '
        "by another connection; it must return a new one"
    )


async def test_a_call_to_an_http_server_that_is_gone_is_not_sent() -> None:
    with hostile_http() as url:
        connection = await connect(Server(name="web", endpoint=url))
    # The server process is killed: nothing listens on its port any more.
    try:
        with pytest.raises(NotSent) as caught:
            await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert str(caught.value).startswith('server "web" could not be reached for tools/call: ')
    assert str(caught.value).endswith("; the request was not sent")
