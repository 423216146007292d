"""What a hostile stdio server can send, and what the connection does with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from servers.harness import stdio_server

from agentrt.mcp import _stdio
from agentrt.mcp._connection import Connection, connect
from agentrt.mcp._connection_errors import (
    CallTimeout,
    ConnectionClosed,
    MessageTooLong,
    NotSent,
    ProtocolViolation,
    ServerErrorResponse,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def _connected(scenario: dict[str, Any]) -> Connection:
    return await connect(stdio_server(scenario))


def _received(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_bytes().splitlines()]


async def test_an_elicitation_mid_call_is_refused_and_the_call_completes(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    connection = await _connected({"calls": {"ask": {"elicit": True}}, "log": str(log)})
    try:
        result = await connection.call_tool("ask", "{}", timeout=10)
    finally:
        await connection.aclose()
    assert result["content"][0]["text"] == "elicitation answered with error -32601"
    answers = [line for line in _received(log) if line.get("id") == "elicit-1"]
    assert answers == [
        {
            "jsonrpc": "2.0",
            "id": "elicit-1",
            "error": {
                "code": -32601,
                "message": "this client does not answer elicitation/create requests",
            },
        }
    ]


async def test_sampling_and_roots_requests_get_errors_and_ping_gets_an_empty_result(
    tmp_path: Path,
) -> None:
    log = tmp_path / "received.jsonl"
    before = [
        '{"jsonrpc":"2.0","id":101,"method":"sampling/createMessage","params":{}}',
        '{"jsonrpc":"2.0","id":"r","method":"roots/list"}',
        '{"jsonrpc":"2.0","id":102,"method":"ping"}',
    ]
    connection = await _connected({"calls": {"ok": {"before": before}}, "log": str(log)})
    try:
        await connection.call_tool("ok", "{}", timeout=10)
    finally:
        await connection.aclose()  # the server logs every line it read before it exits
    answers = {json.dumps(line["id"]): line for line in _received(log) if "method" not in line}
    assert answers["101"]["error"]["code"] == -32601
    assert "sampling/createMessage" in answers["101"]["error"]["message"]
    assert answers['"r"']["error"]["code"] == -32601
    assert answers["102"] == {"jsonrpc": "2.0", "id": 102, "result": {}}


async def test_notifications_and_garbage_lines_do_not_disturb_a_call() -> None:
    before = [
        "this is not json",
        "",
        "[1, 2, 3]",
        '{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}',
        '{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}',
        # Our id as a string, as a decimal: equal in Python, not the same id.
        '{"jsonrpc":"2.0","id":"{id}","result":{"wrong":"id type"}}',
        '{"jsonrpc":"2.0","id":{id}.0,"result":{"wrong":"id type"}}',
        '{"jsonrpc":"2.0","id":true,"result":{"wrong":"id type"}}',
        '{"jsonrpc":"2.0","id":999,"result":{"nobody":"asked"}}',
        '{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"null id"}}',
        "{}",
    ]
    connection = await _connected({"calls": {"ok": {"before": before}}})
    try:
        result = await connection.call_tool("ok", "{}", timeout=10)
    finally:
        await connection.aclose()
    assert result == {"content": [{"type": "text", "text": "ok"}]}


async def test_a_response_with_a_repeated_key_fails_that_call_at_once() -> None:
    line = '{"jsonrpc":"2.0","id":{id},"result":{"content":[],"isError":false,"isError":true}}'
    connection = await _connected({"calls": {"twice": {"line": line}}})
    try:
        with anyio.fail_after(5), pytest.raises(ProtocolViolation) as caught:
            await connection.call_tool("twice", "{}", timeout=30)
        # The connection itself is unharmed.
        assert await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert str(caught.value) == (
        'server "hostile" answered tools/call with a message this client refuses: '
        'the key "isError" is repeated in one object'
    )


async def test_a_response_with_an_absurd_number_fails_that_call() -> None:
    line = '{"jsonrpc":"2.0","id":{id},"result":{"content":[],"n":1e999999}}'
    connection = await _connected({"calls": {"huge": {"line": line}}})
    try:
        with anyio.fail_after(5), pytest.raises(ProtocolViolation) as caught:
            await connection.call_tool("huge", "{}", timeout=30)
    finally:
        await connection.aclose()
    assert "exponent" in str(caught.value)


async def test_a_response_that_is_not_jsonrpc_2_fails_that_call() -> None:
    line = '{"jsonrpc":"1.0","id":{id},"result":{"content":[]}}'
    connection = await _connected({"calls": {"old": {"line": line}}})
    try:
        with anyio.fail_after(5), pytest.raises(ProtocolViolation):
            await connection.call_tool("old", "{}", timeout=30)
    finally:
        await connection.aclose()


async def test_a_jsonrpc_error_names_the_server_and_escapes_its_message() -> None:
    error = {"code": -32000, "message": "disk full\x1b[31m\u202eevil", "data": {"n": 1}}
    connection = await _connected({"calls": {"fail": {"error": error}}})
    try:
        with pytest.raises(ServerErrorResponse) as caught:
            await connection.call_tool("fail", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert str(caught.value) == (
        'server "hostile" answered tools/call with error -32000: disk full\\x1b[31m\\u202eevil'
    )
    assert caught.value.code == -32000 and caught.value.data == {"n": 1}


async def test_a_call_that_is_never_answered_times_out_and_is_cancelled(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    connection = await _connected({"calls": {"hang": {"never": True}}, "log": str(log)})
    try:
        with pytest.raises(CallTimeout) as caught:
            await connection.call_tool("hang", '{"q": 1}', timeout=0.3)
        assert isinstance(caught.value, TimeoutError)
        # The connection is still usable after a timed-out call.
        assert await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()
    received = _received(log)
    call = next(line for line in received if line.get("params", {}).get("name") == "hang")
    cancelled = [line for line in received if line.get("method") == "notifications/cancelled"]
    assert [line["params"]["requestId"] for line in cancelled] == [call["id"]]
    assert str(caught.value) == (
        'server "hostile" did not answer tools/call within 0.3s; the request was cancelled'
    )


async def test_a_caller_cancelling_a_call_also_sends_cancelled(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    connection = await _connected({"calls": {"hang": {"never": True}}, "log": str(log)})
    try:
        with anyio.move_on_after(0.3):
            await connection.call_tool("hang", "{}", timeout=30)
    finally:
        await connection.aclose()
    assert any(line.get("method") == "notifications/cancelled" for line in _received(log))


async def test_a_server_exiting_mid_call_fails_the_call_with_its_status() -> None:
    connection = await _connected({"calls": {"die": {"exit": 7}}})
    try:
        with anyio.fail_after(5), pytest.raises(ConnectionClosed) as caught:
            await connection.call_tool("die", "{}", timeout=30)
        with pytest.raises(ConnectionClosed):
            await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert str(caught.value) == 'server "hostile" exited (status 7)'


SEVENTEEN_MB = 17_000_000  # past MAX_LINE_BYTES (16 MiB), as a large file read is


@pytest.mark.parametrize("id_last", [False, True], ids=["id-first", "id-last"])
async def test_a_17_mb_answer_fails_only_its_call_and_the_connection_stays_usable(
    id_last: bool,
) -> None:
    big = {"text_of_size": SEVENTEEN_MB, "id_last": id_last}
    connection = await _connected({"calls": {"big": big}})
    try:
        with anyio.fail_after(30), pytest.raises(MessageTooLong) as caught:
            await connection.call_tool("big", "{}", timeout=30)
        assert connection.needs_restart() is None
        result = await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert result["content"][0]["text"] == "ok"
    assert str(caught.value).startswith('server "hostile" answered tools/call with a message of ')
    assert str(caught.value).endswith(
        f"longer than {_stdio.MAX_LINE_BYTES}; it was discarded unread, "
        "so the request ran but its answer is unknown"
    )


async def test_a_17_mb_answer_spares_a_call_in_flight_beside_it() -> None:
    calls = {
        "big": {"sleep": 0.2, "text_of_size": SEVENTEEN_MB, "id_last": True},
        "late": {"sleep": 0.6, "result": '{"content":[{"type":"text","text":"late"}]}'},
    }
    connection = await _connected({"calls": calls})
    outcomes: dict[str, Any] = {}

    async def call(name: str) -> None:
        try:
            outcomes[name] = await connection.call_tool(name, "{}", timeout=30)
        except MessageTooLong as exc:
            outcomes[name] = exc

    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(call, "big")
                group.start_soon(call, "late")
    finally:
        await connection.aclose()
    assert isinstance(outcomes["big"], MessageTooLong)
    assert outcomes["late"]["content"][0]["text"] == "late"


async def test_an_answer_smuggled_after_the_cut_of_an_overlong_line_is_never_read() -> None:
    # One line: 17 MB of junk, then what would be a valid answer to this very call.
    smuggled = (
        '{"jsonrpc":"2.0","id":{id},"result":{"content":[{"type":"text","text":"smuggled"}]}}'
    )
    line = '{"junk":"{pad}"}' + smuggled
    connection = await _connected({"calls": {"smuggle": {"line": line, "pad": SEVENTEEN_MB}}})
    try:
        with anyio.fail_after(30), pytest.raises(CallTimeout):
            await connection.call_tool("smuggle", "{}", timeout=5)
        result = await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert result["content"][0]["text"] == "ok"


async def test_a_call_to_a_server_that_died_is_not_sent() -> None:
    connection = await _connected({"calls": {"die": {"exit": 7}}})
    try:
        with pytest.raises(ConnectionClosed) as cut_off:
            await connection.call_tool("die", "{}", timeout=10)
        assert connection.needs_restart() == 'server "hostile" exited (status 7)'
        with pytest.raises(NotSent) as caught:
            await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert not isinstance(cut_off.value, NotSent)  # that one was sent: its outcome is unknown
    assert str(caught.value) == 'server "hostile" exited (status 7); the request was not sent'


async def test_a_call_after_close_is_not_sent() -> None:
    connection = await _connected({})
    await connection.aclose()
    with pytest.raises(NotSent) as caught:
        await connection.call_tool("ok", "{}", timeout=5)
    assert connection.needs_restart() is None  # closed on purpose: never started again
    assert str(caught.value) == (
        'the connection to server "hostile" is closed; the request was not sent'
    )


async def test_an_unknown_protocol_version_is_refused_at_the_handshake(tmp_path: Path) -> None:
    result = '{"protocolVersion":"1999-01-01","capabilities":{},"serverInfo":{"name":"x"}}'
    with pytest.raises(ProtocolViolation) as caught:
        await connect(stdio_server({"initialize": {"result": result}}))
    assert "chose protocol version 1999-01-01, which this client does not speak" in str(
        caught.value
    )


async def test_arguments_that_are_not_a_json_object_are_refused_before_sending(
    tmp_path: Path,
) -> None:
    log = tmp_path / "received.jsonl"
    connection = await _connected({"log": str(log)})
    try:
        for bad in ("[1]", '{"a":1,"a":2}', '{"a":1} {"b":2}', "{"):
            with pytest.raises(ValueError):
                await connection.call_tool("ok", bad, timeout=5)
    finally:
        await connection.aclose()
    assert not any(line.get("method") == "tools/call" for line in _received(log))


async def test_pretty_printed_arguments_are_sent_on_one_line(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    connection = await _connected({"log": str(log)})
    try:
        pretty = '{\n  "path": "a\\nb",\r\n  "n": 1.50\n}'
        result = await connection.call_tool("ok", pretty, timeout=5)
    finally:
        await connection.aclose()
    assert result["content"][0]["text"] == "ok"
    call = next(line for line in log.read_bytes().splitlines() if b"tools/call" in line)
    assert b'"arguments":{   "path": "a\\nb",    "n": 1.50 }' in call


async def test_a_response_that_is_not_utf8_fails_that_call_and_spares_the_rest() -> None:
    bad = b'{"jsonrpc":"2.0","id":{id},"result":{"content":[],"text":"\xff\xfe"}}'
    junk = b"\xff\xff not even json"
    scenario = {"calls": {"latin": {"before_hex": [junk.hex(), bad.hex()], "never": True}}}
    connection = await _connected(scenario)
    try:
        with anyio.fail_after(5), pytest.raises(ProtocolViolation) as caught:
            await connection.call_tool("latin", "{}", timeout=30)
        assert await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert str(caught.value) == (
        'server "hostile" answered tools/call with a message this client refuses: '
        "the input is not valid UTF-8 (byte 55)"
    )


async def test_a_late_answer_to_a_timed_out_call_is_ignored() -> None:
    late = {"sleep": 0.4, "result": '{"content":[{"type":"text","text":"late"}]}'}
    connection = await _connected({"calls": {"late": late}})
    try:
        with pytest.raises(CallTimeout):
            await connection.call_tool("late", "{}", timeout=0.1)
        await anyio.sleep(0.5)  # the late answer is on the pipe by now
        result = await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert result["content"][0]["text"] == "ok"


_BIG_ARGUMENTS = json.dumps({"blob": "b" * 300_000})


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deaf server never sees end of stdin; don't wait the full polite grace for it."""
    monkeypatch.setattr(_stdio, "GRACE_AFTER_STDIN_CLOSED", 0.3)


async def test_a_write_cut_off_by_the_timeout_closes_the_connection(short_grace: None) -> None:
    connection = await _connected({"deaf_after_handshake": True})
    try:
        with pytest.raises(CallTimeout):
            await connection.call_tool("ok", _BIG_ARGUMENTS, timeout=0.3)
        # Half a request sits in the server's stdin: nothing more may follow it.
        with pytest.raises(ConnectionClosed) as caught:
            await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()
    assert "was cut off mid-write, so the connection is closed" in str(caught.value)


async def test_close_while_a_write_is_blocked_fails_the_call_cleanly(short_grace: None) -> None:
    connection = await _connected({"deaf_after_handshake": True})
    errors: list[BaseException] = []

    async def call() -> None:
        try:
            await connection.call_tool("ok", _BIG_ARGUMENTS, timeout=30)
        except ConnectionClosed as exc:
            errors.append(exc)

    with anyio.fail_after(15):
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await anyio.sleep(0.3)
            await connection.aclose()
    assert len(errors) == 1


async def test_a_server_that_writes_before_it_reads_does_not_deadlock_a_big_request() -> None:
    # The server fills its stdout (300 KB) before reading again; our 300 KB
    # request fills its stdin.  Each side would wait for the other forever.
    connection = await _connected({"flood_after_handshake": 300_000})
    try:
        with anyio.fail_after(10):
            result = await connection.call_tool("echo", _BIG_ARGUMENTS, timeout=10)
    finally:
        await connection.aclose()
    assert _BIG_ARGUMENTS in result["content"][0]["text"]


async def test_what_a_server_writes_while_a_request_waits_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_stdio, "MAX_LINE_BYTES", 50_000)
    connection = await _connected({"flood_after_handshake": 300_000})
    try:
        with anyio.fail_after(10), pytest.raises(ProtocolViolation) as caught:
            await connection.call_tool("echo", _BIG_ARGUMENTS, timeout=10)
    finally:
        await connection.aclose()
    assert "wrote more than 100000 bytes without reading its stdin" in str(caught.value)
