"""The stdio front for a host of the 2026-07-28 era (`proxy/_modern.py`, decision 0052): its
discover, listings and calls are answered without the MCP SDK's server, byte for byte as
that server answers them; every other method of the era still loads the SDK's server."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from proxy_helpers import ProxySetup, build_setup

from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

_LOADED = "loading the MCP SDK's server"
MODERN = "2026-07-28"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "raw-2026-host", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
}

# The proxy with every request of the era handed to the SDK's server, as before the front
# answered them: what the front's answers must equal.
_SDK_ONLY = """
import sys
from agentrt.proxy import _dispatch
from agentrt.proxy.__main__ import main

async def to_sdk(self, request):
    await self._to_sdk(request)

_dispatch.StdioFront._modern_request = to_sdk
sys.exit(main(sys.argv[1:]))
"""


def _request(request_id: int, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"

# What a 2026 host sends, and what a broken one does: each answered alike by both.
REQUESTS: list[tuple[str, dict[str, Any] | None]] = [
    ("server/discover", {"_meta": ENVELOPE}),
    ("tools/list", {"_meta": ENVELOPE}),
    ("prompts/list", {"_meta": ENVELOPE}),
    ("resources/list", {"_meta": ENVELOPE}),
    ("resources/templates/list", {"_meta": ENVELOPE}),
    ("ping", {"_meta": ENVELOPE}),  # no method of the era
    ("tools/call", {"name": "up_echo", "arguments": {"text": "hé \u2028"}, "_meta": ENVELOPE}),
    ("tools/call", {"name": "gate_status", "arguments": {}, "_meta": ENVELOPE}),
    ("tools/call", {"name": "no_such_tool", "arguments": {}, "_meta": ENVELOPE}),
    # Bad input: each refused with the SDK's code, message and data.
    ("tools/call", {"arguments": {"text": "nameless"}, "_meta": ENVELOPE}),
    ("tools/list", {"cursor": 5, "_meta": ENVELOPE}),
    ("tools/list", None),
    ("tools/list", {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}}),
    ("tools/list", {"_meta": {**ENVELOPE, _VERSION_KEY: 7}}),
    ("tools/list", {"_meta": {**ENVELOPE, _VERSION_KEY: "2099-01-01"}}),
    ("tools/list", {"_meta": {**ENVELOPE, "io.modelcontextprotocol/logLevel": "loudest"}}),
    ("tools/call", {"name": "up_echo", "arguments": {"text": "x"}, "_meta": {
        **ENVELOPE, "io.modelcontextprotocol/clientCapabilities": "not an object"}}),
]  # fmt: skip


@asynccontextmanager
async def _proxy(setup: ProxySetup, sdk_only: bool) -> AsyncIterator[_Wire]:
    command = setup.command()
    if sdk_only:
        command = [sys.executable, "-c", _SDK_ONLY, *command[command.index("--config") :]]
    with setup.stderr_path.open("a") as errlog:
        process = await anyio.open_process(
            command, stderr=errlog, env=setup.environment(), cwd=str(setup.root)
        )
        async with process:
            try:
                yield _Wire(process)
            finally:
                process.kill()


class _Wire:
    """Raw lines to and from a proxy: the exact bytes it answers with."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self._reader = BufferedByteReceiveStream(process.stdout)
        self.notes: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        await self._process.stdin.send(json.dumps(message).encode() + b"\n")

    async def ask(self, message: dict[str, Any]) -> bytes:
        await self.send(message)
        return await self.answer(message["id"])

    async def answer(self, request_id: int) -> bytes:
        """The answer to `request_id`; every other line read meanwhile goes to `notes`."""
        with anyio.fail_after(30):
            while True:
                line = await self._reader.receive_until(b"\n", 1 << 22)
                parsed = json.loads(line)
                if parsed.get("id") == request_id and "method" not in parsed:
                    return bytes(line)
                self.notes.append(parsed)


# A call whose request asked for the server's log lines: the line reaches the host first.
_LOGGED = (
    "tools/call",
    {"name": "up_echo", "arguments": {"text": "log:asked"},
     "_meta": {**ENVELOPE, "io.modelcontextprotocol/logLevel": "warning"}},
)  # fmt: skip


async def _answers(setup: ProxySetup, sdk_only: bool) -> tuple[list[bytes], list[Any]]:
    async with _proxy(setup, sdk_only) as wire:
        answers = [
            await wire.ask(_request(index, method, params))
            for index, (method, params) in enumerate([*REQUESTS, _LOGGED])
        ]
        return answers, wire.notes


async def test_the_fronts_answers_to_a_2026_host_are_the_sdk_servers_byte_for_byte(
    tmp_path: Path,
) -> None:
    front_setup = await build_setup(tmp_path / "front")
    sdk_setup = await build_setup(tmp_path / "sdk")
    front, front_notes = await _answers(front_setup, sdk_only=False)
    sdk, sdk_notes = await _answers(sdk_setup, sdk_only=True)
    for (method, params), ours, theirs in zip([*REQUESTS, _LOGGED], front, sdk, strict=True):
        assert ours == theirs, (method, params)
    # The log line, in the SDK's key order.
    assert [json.dumps(note) for note in front_notes] == [json.dumps(n) for n in sdk_notes]
    assert [note["params"]["level"] for note in front_notes] == ["warning"]
    assert _LOADED not in front_setup.stderr()
    assert _LOADED in sdk_setup.stderr()  # the comparison was with the SDK's server
    discovered = json.loads(front[0])["result"]
    assert discovered["supportedVersions"] == [MODERN]
    assert discovered["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "agentrt-proxy"
    echoed = json.loads(front[6])["result"]
    assert echoed["resultType"] == "complete"
    assert echoed["content"][0]["text"] == "hé \u2028"
    refused = [json.loads(line)["error"]["code"] for line in front[9:-1]]
    assert refused == [-32602, -32602, -32602, -32602, -32602, -32022, -32602, -32602]
    assert json.loads(front[5])["error"] == {
        "code": -32601, "message": "Method not found", "data": "ping"
    }  # fmt: skip
    with open_store(front_setup.database, read_only=True) as store:
        assert store.verify_chain().ok


def _masked(line: bytes) -> str:
    """An input-required answer with what differs from one proxy to another (the request
    state, the approval's ids and hash in the question) masked."""
    text = re.sub(r'"requestState":"[^"]*"', '"requestState":"…"', line.decode())
    return re.sub(r'"message":"[^"]*"', '"message":"…"', text)


async def test_a_2026_call_held_for_the_host_rides_an_input_required_result_as_the_sdks_does(
    tmp_path: Path,
) -> None:
    held = _request(1, "tools/call", {
        "name": "up_send_mail", "arguments": {"to": "ops@example.org", "body": "hi"},
        "_meta": ENVELOPE,
    })  # fmt: skip
    answers: dict[bool, bytes] = {}
    retried: dict[bool, dict[str, Any]] = {}
    for sdk_only in (False, True):
        setup = await build_setup(tmp_path / str(sdk_only), approve_in_host=True)
        async with _proxy(setup, sdk_only) as wire:
            answers[sdk_only] = await wire.ask(held)
            question = json.loads(answers[sdk_only])["result"]
            [key] = question["inputRequests"]
            retry = {**held["params"], "requestState": question["requestState"],
                     "inputResponses": {key: {"action": "accept", "content": {
                         "decision": "approve", "note": "approved statelessly"}}}}  # fmt: skip
            retried[sdk_only] = json.loads(await wire.ask(_request(2, "tools/call", retry)))
        assert setup.executions() == ["send_mail ops@example.org"]
        assert (_LOADED in setup.stderr()) is sdk_only
    assert _masked(answers[False]) == _masked(answers[True])
    assert json.loads(answers[False])["result"]["resultType"] == "input_required"
    assert retried[False] == retried[True]
    assert retried[False]["result"]["isError"] is False


async def test_a_2026_calls_progress_reaches_the_host_and_a_cancelled_call_is_never_answered(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    setup.rewrite(hold="2500ms")  # a held call waits, telling its progress
    held = {"name": "up_send_mail", "arguments": {"to": "p@q.r", "body": "x"}}
    async with _proxy(setup, sdk_only=False) as wire:
        await wire.send(_request(1, "tools/call", {
            **held, "_meta": {**ENVELOPE, "progressToken": "watch"}}))  # fmt: skip
        await wire.send(_request(2, "tools/call", {**held, "_meta": ENVELOPE}))
        await wire.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": 2}})  # fmt: skip
        listed = json.loads(await wire.ask(_request(3, "tools/list", {"_meta": ENVELOPE})))
        answered = json.loads(await wire.answer(1))
        await anyio.sleep(1.0)  # the cancelled call's own hold is over by now
        json.loads(await wire.ask(_request(4, "tools/list", {"_meta": ENVELOPE})))
    progress = [
        note["params"] for note in wire.notes if note.get("method") == "notifications/progress"
    ]
    assert len(progress) >= 2 and {note["progressToken"] for note in progress} == {"watch"}
    assert [note["progress"] for note in progress] == sorted(note["progress"] for note in progress)
    assert answered["result"]["content"][0]["text"].startswith("PENDING_APPROVAL: ")
    assert any(tool["name"] == "up_send_mail" for tool in listed["result"]["tools"])
    assert not any(note.get("id") == 2 for note in wire.notes)  # the host gets no answer (MCP)
    assert _LOADED not in setup.stderr()


async def test_a_2026_host_that_listed_is_told_no_list_change_outside_a_listen_stream(
    tmp_path: Path,
) -> None:
    # In the era a list change is told only on a subscriptions/listen stream the host opened;
    # the SDK's connection channel drops it, and so does the front.
    rules = {"echo": {"side_effect": "read_only"}, "send_mail": {"side_effect": "read_only"}}
    setup = await build_setup(tmp_path, rules=rules)
    [server] = setup.document["servers"]
    listing = {"_meta": ENVELOPE}
    async with _proxy(setup, sdk_only=False) as wire:
        listed = json.loads(await wire.ask(_request(1, "tools/list", listing)))
        setup.rewrite(servers=[{**server, "rules": {"echo": rules["echo"]}}])
        names = {tool["name"] for tool in listed["result"]["tools"]}
        with anyio.fail_after(30):
            for index in range(2, 1000):
                relisted = json.loads(await wire.ask(_request(index, "tools/list", listing)))
                names = {tool["name"] for tool in relisted["result"]["tools"]}
                if "up_send_mail" not in names:
                    break
                await anyio.sleep(0.2)
        await wire.ask(_request(1000, "tools/list", listing))
    assert "up_send_mail" in {tool["name"] for tool in listed["result"]["tools"]}
    assert names == {"up_echo", "gate_status"}  # the change was taken
    assert [note.get("method") for note in wire.notes] == []
    assert _LOADED not in setup.stderr()


_LISTEN = {"notifications": {"toolsListChanged": True, "promptsListChanged": True,
                             "resourcesListChanged": False}, "_meta": ENVELOPE}  # fmt: skip


async def _listened(setup: ProxySetup, sdk_only: bool) -> list[bytes]:
    """A listen stream's lines: refusals, the acknowledgement, a list change told on it,
    then the host's cancel (no answer), and the proxy still answering."""
    rules = {"echo": {"side_effect": "read_only"}, "send_mail": {"side_effect": "read_only"}}
    [server] = setup.document["servers"]
    lines: list[bytes] = []
    async with _proxy(setup, sdk_only) as wire:
        lines.append(await wire.ask(_request(1, "subscriptions/listen", {"_meta": ENVELOPE})))
        lines.append(await wire.ask(_request(2, "subscriptions/listen", {
            "notifications": "none", "_meta": ENVELOPE})))  # fmt: skip
        lines.append(await wire.ask(_request(3, "subscriptions/listen", {"notifications": {}})))
        await wire.send(_request(4, "subscriptions/listen", _LISTEN))

        async def line() -> bytes:
            return bytes(await wire._reader.receive_until(b"\n", 1 << 22))

        with anyio.fail_after(30):
            lines.append(await line())  # the acknowledgement
            setup.rewrite(servers=[{**server, "rules": {"echo": rules["echo"]}}])
            while b"list_changed" not in lines[-1] or len(lines) < 5:
                lines.append(await line())
        await wire.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": 4}})  # fmt: skip
        lines.append(await wire.ask(_request(5, "tools/list", {"_meta": ENVELOPE})))
        lines.extend(json.dumps(note).encode() for note in wire.notes)
    return lines


async def test_the_fronts_listen_stream_is_the_sdk_servers_byte_for_byte(
    tmp_path: Path,
) -> None:
    rules = {"echo": {"side_effect": "read_only"}, "send_mail": {"side_effect": "read_only"}}
    front_setup = await build_setup(tmp_path / "front", rules=rules)
    sdk_setup = await build_setup(tmp_path / "sdk", rules=rules)
    front, sdk = await _listened(front_setup, False), await _listened(sdk_setup, True)
    assert front == sdk
    assert b'"io.modelcontextprotocol/subscriptionId":4' in front[3]
    assert b"notifications/tools/list_changed" in front[-2] or any(
        b"notifications/tools/list_changed" in line for line in front[4:]
    )
    assert not any(json.loads(line).get("id") == 4 for line in front)  # cancelled: no answer
    assert _LOADED not in front_setup.stderr()


async def test_a_2026_method_the_front_does_not_answer_loads_the_sdks_server_and_calls_go_on(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    async with _proxy(setup, sdk_only=False) as wire:
        first = json.loads(await wire.ask(_request(1, "tools/call", {
            "name": "up_echo", "arguments": {"text": "1"}, "_meta": ENVELOPE})))  # fmt: skip
        assert _LOADED not in setup.stderr()
        # An initialize on a connection of the era is the SDK's to refuse.
        refused = json.loads(await wire.ask(_request(2, "initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "late", "version": "0"}})))  # fmt: skip
        second = json.loads(await wire.ask(_request(3, "tools/call", {
            "name": "up_echo", "arguments": {"text": "2"}, "_meta": ENVELOPE})))  # fmt: skip
    assert refused.get("error", {}).get("code") == -32022, refused
    assert [first["result"]["content"][0]["text"], second["result"]["content"][0]["text"]] == [
        "1",
        "2",
    ]
    assert setup.stderr().count(_LOADED) == 1


# -- over streamable HTTP ---------------------------------------------------------------

# Each POST the SDK's stateless entry answers is told on stderr; with `sdk_only`, the front
# hands every POST of the era to it.
_HTTP_PROBE = """
import sys
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from agentrt.proxy import _http_front
from agentrt.proxy.__main__ import main

entry = StreamableHTTPSessionManager.handle_request

async def told(self, scope, receive, send):
    print("SDK ENTRY", flush=True, file=sys.stderr)
    await entry(self, scope, receive, send)

StreamableHTTPSessionManager.handle_request = told
if SDK_ONLY:
    async def to_sdk(self, *args):
        return False

    _http_front.HTTPFront.answer_modern = to_sdk
sys.exit(main(sys.argv[1:]))
"""


@asynccontextmanager
async def _http_proxy(setup: ProxySetup, sdk_only: bool) -> AsyncIterator[str]:
    from proxy_helpers import free_port, until

    port = free_port()
    command = [*setup.command(), "--http", f"127.0.0.1:{port}"]
    probe = _HTTP_PROBE.replace("SDK_ONLY", repr(sdk_only))
    command = [sys.executable, "-c", probe, *command[command.index("--config") :]]
    with setup.stderr_path.open("a") as errlog:
        process = await anyio.open_process(
            command, stderr=errlog, env=setup.environment(), cwd=str(setup.root)
        )
        try:
            await until(lambda: "serving streamable HTTP" in setup.stderr())
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            process.terminate()
            with anyio.fail_after(20):
                await process.wait()


def _posted(method: str, params: dict[str, Any] | None) -> dict[str, str]:
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": MODERN,
        "mcp-method": method,
    }
    name = (params or {}).get("name")
    if method == "tools/call" and isinstance(name, str):
        headers["mcp-name"] = name
    return headers


# Over HTTP the version header routes the POST to the era; a log line the request asks for
# makes its answer an event stream.
HTTP_REQUESTS = [
    *REQUESTS[:9],
    ("tools/call", {"name": "up_echo", "arguments": {"text": "log:asked"}, "_meta": {
        **ENVELOPE, "io.modelcontextprotocol/logLevel": "warning"}}),
    ("tools/call", {"name": "up_echo", "arguments": {"text": "log:unasked"}, "_meta": ENVELOPE}),
    *REQUESTS[9:12],
    *REQUESTS[14:],
]  # fmt: skip


async def _http_answers(setup: ProxySetup, sdk_only: bool) -> list[tuple[int, str, bytes]]:
    import httpx2

    answers = []
    async with _http_proxy(setup, sdk_only) as url, httpx2.AsyncClient(timeout=30.0) as client:

        async def post(index: int, method: str, params: dict[str, Any] | None) -> bytes:
            body = json.dumps(_request(index, method, params)).encode()
            posted = await client.post(url, content=body, headers=_posted(method, params))
            answers.append(
                (posted.status_code, posted.headers.get("content-type", ""), posted.content)
            )
            return posted.content

        for index, (method, params) in enumerate(HTTP_REQUESTS):
            await post(index, method, params)
    return answers


@pytest.mark.slow
async def test_the_http_fronts_answers_to_2026_posts_are_the_sdk_entrys_byte_for_byte(
    tmp_path: Path,
) -> None:
    front_setup = await build_setup(tmp_path / "front")
    sdk_setup = await build_setup(tmp_path / "sdk")
    front = await _http_answers(front_setup, sdk_only=False)
    sdk = await _http_answers(sdk_setup, sdk_only=True)
    for (method, params), ours, theirs in zip(HTTP_REQUESTS, front, sdk, strict=True):
        assert ours == theirs, (method, params)
    # Answered by the front: the SDK's entry saw only the POST without an envelope (its
    # ladder's refusal); handed the era, it saw every POST but the one whose body names
    # another version than its header (the proxy's own header check refuses it first).
    assert (front_setup.stderr().count("SDK ENTRY"), sdk_setup.stderr().count("SDK ENTRY")) == (
        1,
        len(HTTP_REQUESTS) - 1,
    )
    kinds = [content_type for _, content_type, _ in front]
    assert kinds[9] == "text/event-stream"  # the log line asked for came first
    assert b"warning log:asked" in front[9][2]
    assert kinds[10] == "application/json" and b"log:unasked" in front[10][2]
    assert [status for status, _, _ in front[11:]] == [400] * 6
    with open_store(front_setup.database, read_only=True) as store:
        assert store.verify_chain().ok
