"""Over streamable HTTP the proxy chooses per request how to answer it.

A request whose response is the first thing the server has for it is
answered in one `application/json` body; one that sends progress (under the
host's `progressToken`), log lines or a request to the host (an elicitation)
first is answered on a `text/event-stream` carrying those, the response
last.  One proxy for the module, over HTTP, in front of the conformance
server (a real MCP server over stdio); hosts are httpx2 for the raw headers
and the SDK's ClientSession.  The logging test sets the proxy's level for
the process (2025 hosts get the lines on their standalone stream), so it runs last.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from proxy_helpers import (
    HTTPProxy,
    conformance_config,
    raw_http_host,
    serving_http,
    sse_data,
    text_of,
)

from agentrt.proxy._http import listen

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPProxy]:
    root = tmp_path_factory.mktemp("answers")
    log = root / "upstream.log"
    config = conformance_config(
        root, "answers", env=[f"CONFORMANCE_LOG={log}"], client_requests={"elicitation": "forward"}
    )
    with serving_http(config, root) as (url, stderr):
        yield HTTPProxy(url, stderr)


async def test_a_call_without_a_progress_token_is_answered_in_one_json_body(
    running: HTTPProxy,
) -> None:
    async with raw_http_host(running.url) as host:
        answer = await host.call("test_simple_text")
        again = await host.call("test_simple_text")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["mcp-session-id"] == host.session_id
    message = answer.json()
    assert message["id"] == host.next_id - 1 and "error" not in message
    assert "simple text response" in message["result"]["content"][0]["text"]
    assert (
        again.headers["content-type"] == "application/json" and again.json()["id"] == host.next_id
    )


async def test_a_call_with_a_progress_token_is_streamed_and_carries_the_servers_progress(
    running: HTTPProxy,
) -> None:
    async with raw_http_host(running.url) as host:
        answer = await host.call("test_tool_with_progress", {"progressToken": "host-token-7"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    messages = sse_data(answer.text.splitlines())
    progress = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
    assert progress and all(p["progressToken"] == "host-token-7" for p in progress)
    assert [p["progress"] for p in progress] == sorted(p["progress"] for p in progress)
    assert messages[-1]["id"] == host.next_id
    assert "progress executed successfully" in messages[-1]["result"]["content"][0]["text"]


@asynccontextmanager
async def sdk_host(url: str, answers: list[tuple[str, str]], **callbacks: Any) -> Any:
    """The SDK's ClientSession, noting each POST's JSON-RPC method and the answer's type."""

    async def note(response: httpx2.Response) -> None:
        if response.request.method == "POST":
            method = json.loads(response.request.content).get("method", "")
            answers.append((method, response.headers.get("content-type", "")))

    async with (
        httpx2.AsyncClient(timeout=30.0, event_hooks={"response": [note]}) as client,
        streamable_http_client(url, http_client=client) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream, **callbacks) as session,
    ):
        await session.initialize()
        yield session


async def test_a_call_whose_server_asks_a_capable_host_is_streamed_and_the_request_reaches_it(
    running: HTTPProxy,
) -> None:
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"username": "ada"})

    answers: list[tuple[str, str]] = []
    async with sdk_host(running.url, answers, elicitation_callback=on_elicit) as session:
        asking = await session.call_tool("test_elicitation", {"message": "Who are you?"})
        # The same host and server, a call that asks nothing: one JSON body.
        plain = await session.call_tool("test_simple_text", {})
    assert asked == ["Who are you?"]
    assert not asking.is_error and "ada" in text_of(asking)
    assert not plain.is_error
    calls = [kind for method, kind in answers if method == "tools/call"]
    assert calls[0].startswith("text/event-stream") and calls[1] == "application/json"


async def test_a_host_that_cannot_answer_is_never_asked_and_gets_json(running: HTTPProxy) -> None:
    answers: list[tuple[str, str]] = []
    async with sdk_host(running.url, answers) as session:
        result = await session.call_tool("test_elicitation", {"message": "Anyone?"})
    assert result.is_error and "did not advertise the elicitation capability" in text_of(result)
    assert [kind for method, kind in answers if method == "tools/call"] == ["application/json"]


@pytest.mark.slow
async def test_a_call_silent_for_15_seconds_is_streamed_with_keep_alives(
    running: HTTPProxy,
) -> None:
    # Nothing for the host for 16 s: the answer becomes an event stream kept alive by a
    # comment, as the SDK's streams are, so a host reading with an idle timeout still sees bytes.
    async with raw_http_host(running.url) as host:
        answer = await host.call("test_elicitation_later", seconds=16, ask=False)
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert ": ping" in answer.text
    (result,) = sse_data(answer.text.splitlines())
    assert result["id"] == host.next_id and "asked nothing" in text_of_raw(result)


def text_of_raw(message: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in message["result"]["content"])


async def test_the_listener_turns_nagle_off_on_every_connection_it_accepts() -> None:
    # With Nagle on, a JSON answer's body waited behind its headers for the host's delayed
    # ACK on a kept-alive connection: ~40 ms a call.
    listener = listen("127.0.0.1", 0)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connection, sock=listener)
    try:
        _, writer = await asyncio.open_connection(*listener.getsockname())
        assert await asyncio.wait_for(accepted, 10) != 0
        writer.close()
    finally:
        server.close()


async def test_a_calls_log_lines_reach_the_host_on_its_own_stream_while_the_call_gets_json(
    running: HTTPProxy,
) -> None:
    lines: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        lines.append(str(params.data))

    answers: list[tuple[str, str]] = []
    async with sdk_host(running.url, answers, logging_callback=on_log) as session:
        await session.set_logging_level("info")
        result = await session.call_tool("test_tool_with_logging", {})
        # Forwarded on the host's standalone GET stream, which may deliver after the result.
        with anyio.fail_after(20):
            while len(lines) < 3:
                await anyio.sleep(0.05)
    assert not result.is_error
    assert lines == ["Tool execution started", "Tool processing data", "Tool execution completed"]
    assert [kind for method, kind in answers if method == "tools/call"] == ["application/json"]


async def test_a_sessions_call_is_the_http_fronts_its_question_the_fronts_own_request(
    running: HTTPProxy,
) -> None:
    # Decision 0046: after the SDK's server answered `initialize`, the proxy's HTTP front runs
    # the call; a server's question reaches the host as the front's own request (`agentrt-N`,
    # where the SDK's session numbers its requests), and the host's POSTed answer the call.
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "raw", "version": "1"}}}  # fmt: skip
    accept = "application/json, text/event-stream"
    async with httpx2.AsyncClient(timeout=30.0) as client:
        opened = await client.post(running.url, json=initialize, headers={"accept": accept})
        headers = {"accept": accept, "content-type": "application/json",
                   "mcp-session-id": opened.headers["mcp-session-id"],
                   "mcp-protocol-version": "2025-11-25"}  # fmt: skip
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await client.post(running.url, json=done, headers=headers)
        arguments = {"message": "Who?"}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "test_elicitation", "arguments": arguments}}  # fmt: skip
        async with client.stream("POST", running.url, json=call, headers=headers) as held:
            lines = held.aiter_lines()
            question = await _next_data(lines)
            answer = {"action": "accept", "content": {"username": "ada", "email": "a@b.example"}}
            reply = {"jsonrpc": "2.0", "id": question["id"], "result": answer}
            posted = await client.post(running.url, json=reply, headers=headers)
            result = await _next_data(lines)
    assert question["method"] == "elicitation/create"
    assert str(question["id"]).startswith("agentrt-")
    assert posted.status_code == 202
    assert result["id"] == 2 and "ada" in text_of_raw(result)


async def _next_data(lines: Any) -> dict[str, Any]:
    with anyio.fail_after(20):
        async for line in lines:
            found = sse_data([line])
            if found:
                return found[0]
    raise AssertionError("the stream ended without a message")
