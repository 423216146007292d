"""The proxy's own streamable HTTP session layer (decision 0020), from outside.

One proxy for the module, over HTTP, in front of the conformance server (a
real MCP server over stdio); hosts are httpx2 by hand, so statuses and
headers can be read.  Where the proxy must answer as the SDK's own transport
answers, the same requests go to the SDK's server (the conformance server
served by `Server.streamable_http_app` under uvicorn) and the answers are
compared.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from proxy_helpers import (
    ACCEPT,
    CONFORMANCE,
    INITIALIZE,
    PROTOCOL,
    HTTPProxy,
    conformance_config,
    raw_http_host,
    serving_http,
    sse_data,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPProxy]:
    root = tmp_path_factory.mktemp("sessions")
    config = conformance_config(root, "sessions")
    with serving_http(config, root) as (url, stderr):
        yield HTTPProxy(url, stderr)


@pytest.fixture(scope="module")
def sdk_url() -> Iterator[str]:
    """The conformance server served by the SDK's own streamable HTTP app."""
    process = subprocess.Popen(
        [sys.executable, str(CONFORMANCE), "--http"], stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=20)


async def test_the_proxy_serves_on_uvloop_and_falls_back_to_asyncios_loop_without_it(
    running: HTTPProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # uvloop is a core dependency off Windows (decision 0023): a real proxy names the loop
    # it serves on, and without uvloop the factory leaves the standard library's in place.
    import uvloop

    from agentrt.proxy._lifecycle import event_loop_factory

    assert "(event loop: uvloop)" in running.stderr.read_text()
    assert event_loop_factory() is uvloop.new_event_loop
    monkeypatch.setitem(sys.modules, "uvloop", None)  # an import of it now fails
    assert event_loop_factory() is None


async def test_a_deleted_session_answers_404_from_then_on(running: HTTPProxy) -> None:
    async with raw_http_host(running.url) as host:
        before = await host.request("tools/list", {})
        deleted = await host.client.delete(host.url, headers=host.headers())
        after = await host.request("tools/list", {})
        again = await host.client.delete(host.url, headers=host.headers())
        # Another session is untouched.
        async with raw_http_host(running.url) as other:
            listed = await other.request("tools/list", {})
    assert before.status_code == 200 and "tools" in before.json()["result"]
    assert deleted.status_code == 200 and deleted.headers["mcp-session-id"] == host.session_id
    assert after.status_code == 404 and after.json()["error"]["message"] == "Session not found"
    assert again.status_code == 404
    assert listed.status_code == 200 and "tools" in listed.json()["result"]


async def test_ending_a_session_answers_its_waiting_call_with_the_sdks_500(
    running: HTTPProxy,
) -> None:
    async with raw_http_host(running.url) as host:
        answers: list[httpx2.Response] = []

        async def slow_call() -> None:
            params = {"name": "test_elicitation_later", "arguments": {"seconds": 2, "ask": False}}
            answers.append(await host.request("tools/call", params))

        async with anyio.create_task_group() as group:
            group.start_soon(slow_call)
            await anyio.sleep(0.7)
            deleted = await host.client.delete(host.url, headers=host.headers())
    # The abandoned call still runs upstream; let it end, so that its log listener (which
    # reads the upstream's log lines while it runs) takes none of a later test's lines.
    await anyio.sleep(1.8)
    assert deleted.status_code == 200
    [answer] = answers
    assert answer.status_code == 500
    error = answer.json()["error"]
    assert error == {"code": -32603, "message": "Session terminated before the request completed"}


async def test_a_second_standalone_stream_is_refused_and_a_closed_one_frees_its_place(
    running: HTTPProxy,
) -> None:
    async with raw_http_host(running.url) as host:
        stream_headers = host.headers(accept="text/event-stream")
        async with host.client.stream("GET", host.url, headers=stream_headers) as first:
            second = await host.client.get(host.url, headers=stream_headers)
        # The first host left (its connection closed): the session takes a new stream.
        with anyio.fail_after(20):
            while True:
                async with host.client.stream("GET", host.url, headers=stream_headers) as third:
                    if third.status_code == 200:
                        break
                await anyio.sleep(0.05)
    assert first.status_code == 200
    assert first.headers["content-type"] == "text/event-stream"
    assert second.status_code == 409
    assert second.json()["error"]["message"] == (
        "Conflict: Only one SSE stream is allowed per session"
    )


async def test_the_standalone_stream_carries_what_belongs_to_no_request(
    running: HTTPProxy,
) -> None:
    # The proxy's log lines for a 2025 host go to its standalone stream, not a call's answer.
    async with raw_http_host(running.url) as host:
        stream_headers = host.headers(accept="text/event-stream")
        async with host.client.stream("GET", host.url, headers=stream_headers) as standalone:
            assert standalone.status_code == 200
            level = await host.request("logging/setLevel", {"level": "info"})
            call = await host.request("tools/call", {"name": "test_tool_with_logging"})
            lines: list[str] = []
            with anyio.fail_after(20):
                async for line in standalone.aiter_lines():
                    lines.append(line)
                    logged = [
                        m for m in sse_data(lines) if m.get("method") == "notifications/message"
                    ]
                    if len(logged) == 3:
                        break
    assert level.status_code == 200 and call.status_code == 200
    assert call.headers["content-type"] == "application/json"
    assert [m["params"]["data"] for m in logged] == [
        "Tool execution started", "Tool processing data", "Tool execution completed",
    ]  # fmt: skip


async def test_a_host_leaving_before_its_answer_leaves_nothing_waiting(running: HTTPProxy) -> None:
    async with raw_http_host(running.url) as host:
        params = {"name": "test_elicitation_later", "arguments": {"seconds": 2, "ask": False}}
        body = host.body("tools/call", params, request_id=777)
        async with httpx2.AsyncClient(timeout=30.0) as leaving:
            with anyio.move_on_after(0.5):
                await leaving.post(host.url, content=body, headers=host.headers())
        # While the call runs its id is taken; once it has been answered (to nobody), free.
        taken = await host.client.post(host.url, content=body, headers=host.headers())
        with anyio.fail_after(20):
            while True:
                reused = await host.request("tools/call", {"name": "test_simple_text"}, 777)
                if reused.status_code == 200:
                    break
                await anyio.sleep(0.1)
    assert taken.status_code == 400
    assert "request id 777 is already in flight" in taken.json()["error"]["message"]
    assert reused.json()["id"] == 777 and "result" in reused.json()


async def _probes(url: str, client: httpx2.AsyncClient) -> dict[str, tuple[int, Any]]:
    """What a server answers to requests its transport refuses, status and JSON-RPC code."""
    opened = await client.post(url, json=INITIALIZE, headers={"accept": ACCEPT})
    session = opened.headers["mcp-session-id"]
    good = {"accept": ACCEPT, "content-type": "application/json",
            "mcp-session-id": session, "mcp-protocol-version": PROTOCOL}  # fmt: skip
    listing = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/list"})

    def code(response: httpx2.Response) -> Any:
        try:
            return response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return None

    answers = {
        "POST only json accepted": await client.post(
            url, content=listing, headers={**good, "accept": "application/json"}
        ),
        "POST wrong content type": await client.post(
            url, content=listing, headers={**good, "content-type": "application/jsonx"}
        ),
        "POST not json": await client.post(
            url, content=listing, headers={**good, "content-type": "text/plain"}
        ),
        "POST no session": await client.post(
            url, content=listing, headers={k: v for k, v in good.items() if k != "mcp-session-id"}
        ),
        "POST unknown session": await client.post(
            url, content=listing, headers={**good, "mcp-session-id": "not-a-session"}
        ),
        "POST a notification": await client.post(
            url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=good
        ),
        "GET only json accepted": await client.get(
            url, headers={**good, "accept": "application/json"}
        ),
        "GET no session": await client.get(
            url, headers={"accept": "text/event-stream", "mcp-protocol-version": PROTOCOL}
        ),
        "PUT": await client.put(url, content=listing, headers=good),
        "DELETE no session": await client.delete(url, headers={"accept": ACCEPT}),
        "another path": await client.post(url + "/other", content=listing, headers=good),
        "DELETE": await client.delete(url, headers=good),
        "POST after DELETE": await client.post(url, content=listing, headers=good),
    }
    return {name: (response.status_code, code(response)) for name, response in answers.items()}


async def test_refused_requests_get_the_statuses_and_codes_the_sdks_transport_gives(
    running: HTTPProxy, sdk_url: str
) -> None:
    async with httpx2.AsyncClient(timeout=30.0) as client:
        proxy = await _probes(running.url, client)
        sdk = await _probes(sdk_url, client)
    assert proxy == sdk
    # What each is, so a change on both sides is seen too.
    assert proxy["POST only json accepted"] == (406, -32600)
    assert proxy["POST wrong content type"] == (415, -32600)
    assert proxy["POST not json"][0] == 400
    assert proxy["POST no session"] == (400, -32600)
    assert proxy["POST unknown session"] == (404, -32600)
    assert proxy["POST a notification"] == (202, None)
    assert proxy["GET only json accepted"] == (406, -32600)
    assert proxy["PUT"] == (405, -32600)
    assert proxy["another path"][0] == 404
    assert proxy["DELETE"] == (200, None)
    assert proxy["POST after DELETE"] == (404, -32600)


# -- a session's end: idle, and the proxy's shutdown --------------------------


async def test_a_session_idle_past_its_timeout_ends_and_a_busy_one_stays() -> None:
    # In-process, to give the session layer a short idle timeout (the proxy's is 30 minutes,
    # the SDK's); a real uvicorn, a real SDK `Server` and real HTTP all the same.
    import io

    import uvicorn
    from mcp.server.lowlevel import Server as LowLevelServer

    from agentrt.proxy._http import Doorkeeper, listen
    from agentrt.proxy._streamable import StreamableHTTP

    async def list_tools(ctx: Any, params: Any) -> Any:
        import mcp_types as types

        return types.ListToolsResult(tools=[])

    log = io.StringIO()
    listener = listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"
    app = StreamableHTTP(
        LowLevelServer("tiny", on_list_tools=list_tools),
        Doorkeeper("127.0.0.1", port, None, log).admit, log, idle_seconds=1.0,
    )  # fmt: skip
    served = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    try:
        async with app.running(), anyio.create_task_group() as group:
            group.start_soon(served.serve, [listener])
            with anyio.fail_after(10):
                while not served.started:
                    await anyio.sleep(0.02)
            async with raw_http_host(url) as idle, raw_http_host(url) as busy:
                stream_headers = busy.headers(accept="text/event-stream")
                async with busy.client.stream("GET", url, headers=stream_headers) as held:
                    assert held.status_code == 200
                    await anyio.sleep(2.5)
                    idle_after = await idle.request("tools/list", {})
                    busy_after = await busy.request("tools/list", {})
            served.should_exit = True
            app.drain()
    finally:
        listener.close()
    assert idle_after.status_code == 404
    assert busy_after.status_code == 200 and busy_after.json()["result"] == {"tools": []}
    assert f"ended HTTP session {idle.session_id[:8]}… after 1 s without a request" in (
        log.getvalue()
    )


@pytest.mark.slow
async def test_sigterm_with_a_standalone_stream_open_answers_the_call_and_exits_0(
    tmp_path: Path,
) -> None:
    # The SDK's client holds its standalone GET stream open: the proxy ends it at shutdown
    # (uvicorn would otherwise wait for it forever), the call in flight still gets its answer.
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from proxy_helpers import RULES, build_setup, text_of, until

    setup = await build_setup(
        tmp_path, rules={**RULES, "write_note": {"side_effect": "local_mutation", "timeout": "30s"}}
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    results: list[Any] = []
    with setup.stderr_path.open("a") as errlog:
        process = await anyio.open_process(
            [*setup.command(), "--http", f"127.0.0.1:{port}"],
            stderr=errlog, env=setup.environment(), cwd=str(setup.root),
        )  # fmt: skip
        try:
            await until(lambda: "serving streamable HTTP" in setup.stderr(), 30)
            async with (
                streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                # Listed first: the client would otherwise list the tools after the result
                # (to check it against an output schema), when the proxy has stopped.
                await session.list_tools()

                async def call() -> None:
                    arguments = {"note": "last", "seconds": 2}
                    results.append(await session.call_tool("up_write_note", arguments))

                async with anyio.create_task_group() as group:
                    group.start_soon(call)
                    await until(lambda: len(setup.started()) == 1)
                    process.terminate()
                # The host is still connected, its standalone stream open: the proxy exits.
                with anyio.fail_after(30):
                    code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
    [result] = results
    assert text_of(result) == "noted last"
    assert code == 0, setup.stderr()
    assert setup.executions() == ["write_note last"]
