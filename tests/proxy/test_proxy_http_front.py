"""The HTTP front (decision 0046): a session's calls and listings answered without the
SDK's server, everything else still by it.

In-process: a real uvicorn, the proxy's session layer (`StreamableHTTP`) with an
`HTTPFront`, a real SDK `Server` behind it whose own `tools/call` handler says
it answered, and a host speaking the wire by hand so each answer can be read.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from proxy_helpers import raw_http_host, sse_data

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

Handler = Callable[[Any, Any], Any]


@asynccontextmanager
async def serving(call: Handler, *, front: bool = True) -> AsyncIterator[str]:
    """The session layer on a free port: the SDK's server answers `tools/call` with "sdk",
    the front (when there is one) with `call`."""
    import uvicorn
    from mcp.server.lowlevel import Server as LowLevelServer

    from agentrt.proxy._http import Doorkeeper, listen
    from agentrt.proxy._http_front import HTTPFront
    from agentrt.proxy._streamable import StreamableHTTP

    async def sdk_call(ctx: Any, params: Any) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text="sdk")])

    async def sdk_list(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[])

    async def front_list(ctx: Any, params: Any) -> types.ListToolsResult:
        tool = types.Tool(name="front_tool", input_schema={"type": "object"})
        return types.ListToolsResult(tools=[tool])

    log = io.StringIO()
    listener = listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    methods = {"tools/call": call, "tools/list": front_list}
    app = StreamableHTTP(
        LowLevelServer("tiny", on_call_tool=sdk_call, on_list_tools=sdk_list),
        Doorkeeper("127.0.0.1", port, None, log).admit, log,
        front=HTTPFront(methods, log) if front else None,
    )  # fmt: skip
    served = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    try:
        async with app.running(), anyio.create_task_group() as group:
            group.start_soon(served.serve, [listener])
            with anyio.fail_after(10):
                while not served.started:
                    await anyio.sleep(0.02)
            yield f"http://127.0.0.1:{port}/mcp"
            served.should_exit = True
            app.drain()
    finally:
        listener.close()


def _text(answer: dict[str, Any]) -> str:
    return str(answer["result"]["content"][0]["text"])


async def _said(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def test_a_sessions_call_and_listing_are_the_fronts_and_other_methods_the_sdks() -> None:
    seen: list[Any] = []

    async def call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        seen.append(ctx)
        return await _said(f"front {params.name}")

    async with serving(call) as url, raw_http_host(url) as host:
        called = await host.call("echo")
        listed = await host.request("tools/list", {})
        pinged = await host.request("ping", {})
    assert called.status_code == 200
    assert called.headers["content-type"] == "application/json"
    assert called.headers["mcp-session-id"] == host.session_id
    assert _text(called.json()) == "front echo"
    assert [tool["name"] for tool in listed.json()["result"]["tools"]] == ["front_tool"]
    assert pinged.json()["result"] == {}  # not the front's here: the SDK's server answers
    # The call's context is the host's request: its session header, and the version agreed.
    [ctx] = seen
    assert ctx.request.headers["mcp-session-id"] == host.session_id
    assert ctx.protocol_version == "2025-11-25"
    assert ctx.session.client_params.client_info.name == "raw"


async def test_without_a_front_the_sdks_server_answers_the_call() -> None:
    async with (
        serving(lambda ctx, params: _said("front"), front=False) as url,
        raw_http_host(url) as host,
    ):
        called = await host.call("echo")
    assert _text(called.json()) == "sdk"


async def test_a_call_with_bad_params_is_refused_as_the_sdk_refuses_it() -> None:
    async def call(ctx: Any, params: Any) -> types.CallToolResult:
        raise AssertionError("a call with bad params reached the handler")

    bad = {"name": 7, "arguments": "not an object"}
    answers = []
    for front in (True, False):
        async with serving(call, front=front) as url, raw_http_host(url) as host:
            answer = await host.request("tools/call", bad, request_id=5)
            answers.append((answer.status_code, answer.json()))
    assert answers[0] == answers[1]
    assert answers[0][1]["error"]["code"] == types.INVALID_PARAMS


async def test_a_calls_progress_makes_its_answer_an_event_stream_ending_with_the_result() -> None:
    async def call(ctx: Any, params: Any) -> types.CallToolResult:
        await ctx.session.report_progress(1, 2, "half")
        return await _said("done")

    async with serving(call) as url, raw_http_host(url) as host:
        answer = await host.call("echo", meta={"progressToken": "p1"})
    assert answer.headers["content-type"] == "text/event-stream"
    progress, result = sse_data(answer.text.splitlines())
    assert progress["method"] == "notifications/progress"
    assert progress["params"] == {"progressToken": "p1", "progress": 1, "total": 2,
                                  "message": "half"}  # fmt: skip
    assert _text(result) == "done"


async def test_a_servers_question_during_a_call_reaches_the_host_and_its_answer_the_call() -> None:
    async def call(ctx: Any, params: Any) -> types.CallToolResult:
        answer = await ctx.session._request_outbound.send_raw_request(
            "elicitation/create", {"message": "sure?", "requestedSchema": {"type": "object"}}
        )
        return await _said(f"host said {answer['action']}")

    async with serving(call) as url, raw_http_host(url) as host:
        body = host.body("tools/call", {"name": "echo", "arguments": {}})
        async with host.client.stream("POST", url, content=body, headers=host.headers()) as held:
            lines = held.aiter_lines()
            question = await _next_message(lines)
            assert question["method"] == "elicitation/create"
            reply = {"jsonrpc": "2.0", "id": question["id"], "result": {"action": "accept"}}
            posted = await host.client.post(url, content=json.dumps(reply), headers=host.headers())
            assert posted.status_code == 202
            result = await _next_message(lines)
    assert _text(result) == "host said accept"


async def test_a_call_the_host_cancels_is_answered_request_cancelled() -> None:
    started = anyio.Event()

    async def call(ctx: Any, params: Any) -> types.CallToolResult:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with serving(call) as url, raw_http_host(url) as host:
        answers: list[Any] = []

        async def ask() -> None:
            answers.append(await host.request("tools/call", {"name": "slow"}, request_id=9))

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            with anyio.fail_after(10):
                await started.wait()
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                      "params": {"requestId": 9}}  # fmt: skip
            posted = await host.client.post(url, content=json.dumps(cancel), headers=host.headers())
        after = await host.request("tools/list", {})
    assert posted.status_code == 202
    [answer] = answers
    assert answer.json()["error"] == {"code": -32800, "message": "Request cancelled"}
    assert after.status_code == 200  # the session goes on


async def _next_message(lines: Any) -> dict[str, Any]:
    with anyio.fail_after(10):
        async for line in lines:
            found = sse_data([line])
            if found:
                return found[0]
    raise AssertionError("the stream ended without a message")


async def test_a_front_answer_that_fails_is_answered_an_internal_error_and_the_session_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The front's answers run in tasks of the loop's own (decision 0054): a failure outside
    # the handler (which `answered` already turns into an error) must still answer the POST
    # and leave the session layer serving, not end every session with it.
    from agentrt.proxy._http_front import HTTPFront

    answered = HTTPFront._answered
    broken = {"first": True}

    async def failing_once(self: HTTPFront, session: Any, request: Any, http: Any) -> bytes:
        if broken.pop("first", False):
            raise RuntimeError("the front broke")
        return await answered(self, session, request, http)

    monkeypatch.setattr(HTTPFront, "_answered", failing_once)
    async with serving(lambda ctx, params: _said("front")) as url, raw_http_host(url) as host:
        with anyio.fail_after(20):
            failed = await host.call("echo")
            after = await host.call("echo")
    assert failed.status_code == 200
    assert failed.json()["error"] == {"code": types.INTERNAL_ERROR, "message": "Internal error"}
    assert _text(after.json()) == "front"
